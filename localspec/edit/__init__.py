"""Whole-file edits with the file as the prediction: the task (prompt and prediction), reading the
reply back as a file, and writing it safely. `localspec edit` and the `predicted` bench share it."""
