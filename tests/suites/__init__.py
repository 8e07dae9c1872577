"""The long-context suites (ZeroSCROLLS, SCROLLS, RULER), one module per kind of test."""
