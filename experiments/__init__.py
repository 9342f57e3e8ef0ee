"""Lightning tasks, the CLI, and the tools that compare norm schemes (sweep, analyses)."""
