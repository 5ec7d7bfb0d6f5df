//! Deferred reclamation: no slot is handed out again while a device step that may touch it is in
//! flight. (Owned by the cache-managers work; see ARCHITECTURE.md.)
