"""Local stand-ins for real infrastructure, used by the demo, the tests and the benchmarks:
an embedded S3 server (moto) and a check that Java is there for Spark."""
