"""The small retrieval T5 that ships with t5align (retrieval_t5/: checkpoint, vocabulary, training
record) and what made it: its synthetic training data, the seqio tasks over that data, its
held-out accuracy. Import the modules themselves."""
