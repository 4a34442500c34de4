"""Tests of the advisor layer: the command line and the public simulation API it calls."""
