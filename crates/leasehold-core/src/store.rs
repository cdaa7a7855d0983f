//! The store the core carries itself: memory, for one process (tests, the
//! simulation, `leasehold demo`). The backends are crates above.

pub mod memory;

pub use memory::{Faults, MemoryStore};
