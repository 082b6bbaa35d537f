//! FUSE glue: the only place that names fuser's request and reply types.
