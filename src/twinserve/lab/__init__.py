"""The comparison lab: load generation, benchmarking, reports and advice."""
