"""Reserved token ids shared by the tokenizer, the model and the decoders."""

PAD_ID = 0  # padding; masks are derived from it
BOS_ID = 1  # first input of the decoder (target shifted right)
EOS_ID = 2  # end of sentence; decoding stops after it
UNK_ID = 3  # pieces outside the vocabulary
