"""The data_prep stage kind: the recipe's sources drawn, cleaned, split and tokenized into the
dataset every training and evaluation stage reads.

build.py holds the stage (quarantine, de-duplication, split draws, tokenized arrays, prompt
sets, the data card, the entry point `run`); sources.py reads each source format into
examples, packing.py packs SFT rows. Importers name the module they use; this package
re-exports nothing.
"""
