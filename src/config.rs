//! Mount-wide configuration (PROTOCOL.md §8).
