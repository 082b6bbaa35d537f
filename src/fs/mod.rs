//! The filesystem operations over the backing store.
