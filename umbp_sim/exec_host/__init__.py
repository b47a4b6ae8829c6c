"""``umbp-sim exec``: a program run with its OS calls on a simulated host, held by a keeper
process, and what happened to it."""
