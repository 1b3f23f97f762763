"""Hard negatives (Zhan et al., SIGIR 2021): mining (dense or BM25), STAR's static negatives, ADORE's
dynamic negatives retrieved on device while the query tower trains."""
