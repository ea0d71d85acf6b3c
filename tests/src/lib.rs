//! Root-only integration tests: see tests/README.md
