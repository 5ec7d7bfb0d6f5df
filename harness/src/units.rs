//! Byte sizes with units ("8 GiB") and shares ("90%"). (in progress)
