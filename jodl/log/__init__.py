"""The reconstruction log: every statement on the library's tables."""
