"""The layout arithmetic: which rank sits where and in which groups (`topology`), which block of which
tensor a rank holds and writes (`pieces`), and creating a lazily built parameter as that block
(`materialize`)."""
