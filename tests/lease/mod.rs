//! The lease core on the memory store and paused time: the elector, sessions, the rollout rule, an exhaustive model check and the safety simulation.

mod elector;
mod lock_set;
mod model;
mod rollout;
mod simulation;
mod store_change;
