"""The reliability campaign's runnable commands (fuzz, faults, load); each writes its figures as JSON."""
