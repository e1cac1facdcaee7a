"""tfm and the libraries a researcher would use instead, built from ONE set of weights and run on
the same workloads by `benchmarks/compare.py`. Each system lives in its own module and process."""
