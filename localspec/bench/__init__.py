"""`localspec bench`: suites, runner, anchors and report."""
