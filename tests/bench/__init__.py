"""Tests of bench/: the benchmark commands on tiny models and recorded runs."""
