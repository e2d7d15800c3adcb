"""One adapter per system, each driving it the way that system's documentation recommends from Python."""
