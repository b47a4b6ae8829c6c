"""``umbp-sim compare``: two allocators run by run over a matrix of hosts, requests and faults,
their differences grouped by class, with where the two runs part (the first differing call and
its source line) and the reports (text, JSON, HTML, JUnit), one machine's or merged shards'."""
