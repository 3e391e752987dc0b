"""Wiring one job: reader -> prompt preparation -> engine -> per-split reassembly -> commit, resumable."""
