//! The access policy (PROTOCOL.md §3–§4): pure decisions over identity, operation and zone.
