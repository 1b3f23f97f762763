"""Hard negatives and teachers: mining (dense or BM25), STAR's static negatives, ADORE's dynamic
negatives retrieved on device while the query tower trains (Zhan et al., SIGIR 2021), and a
teacher's scores of each query's candidates (`samtone score`) with the false-negative filter
(guide.py) that mining and teacher-guided training share."""
