"""The reconstruction log: its tables, its SQL and its migrations."""
