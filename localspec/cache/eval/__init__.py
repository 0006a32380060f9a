"""The committed labelled pair set for `localspec cache eval` (see generate_pairs.py)."""
