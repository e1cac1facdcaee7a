"""Experiment sweeps over the training job: `python -m tfm.experiments table3 ...` re-runs the
paper's Table 3 (section 6.2) in miniature or at the paper's scale, locally or as a Slurm job
array, and sets tfm's table beside the paper's."""
