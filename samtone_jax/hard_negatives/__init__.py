"""Hard negatives and teachers: mining (dense or BM25), STAR's static negatives, ADORE's dynamic
negatives retrieved on device while the query tower trains (Zhan et al., SIGIR 2021), and a
teacher's scores of each query's candidates (`samtone score`); the false-negative filter that
mining and teacher-guided training share is data/false_negatives.py."""
