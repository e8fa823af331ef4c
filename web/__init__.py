"""The Flask web UI of JODL and its page checker."""
