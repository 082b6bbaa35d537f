//! Table and property tests of the policy (PROTOCOL.md §3–§4).
