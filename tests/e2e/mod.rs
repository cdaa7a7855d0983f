//! The end-to-end suite: leasehold installed on a real Kubernetes cluster the
//! way the README installs it (CRDs and the chart rendered by real Helm,
//! applied by server-side apply), the examples applied as users apply them,
//! and every scenario watched by the leadership watcher, which fails the test
//! on any moment with two leaders.
//!
//! The cluster comes from variables (README, "End-to-end tests"):
//! `LEASEHOLD_E2E_KUBECONFIG` (a disposable cluster), `LEASEHOLD_E2E_IMAGE`
//! (this tree's leasehold image, loaded there), `LEASEHOLD_E2E_APP_IMAGE` (an
//! image with /bin/busybox, the stand-in app), `LEASEHOLD_E2E_HOST_IP` (an
//! address of this machine the pods reach: the stores run here) and, for the
//! fault scenarios, `LEASEHOLD_E2E_COMPONENT`. `scripts/test.sh` sets them
//! when it starts a cluster itself; without them every test fails saying how
//! to get one. Each test has a namespace of its own; timings are the
//! benchmark's, the bounds here are generous liveness bounds.

mod alerts;
mod cel;
mod cluster;
mod clusters;
mod faults;
mod fenced_workload;
mod fencing;
mod fixtures;
mod injection;
mod install;
mod monitoring;
mod newcomer;
mod node;
mod privilege;
mod prometheus;
mod publishing;
mod run_wrapped;
mod spread;
mod steering;
mod store_change;
mod store_identity;
mod stores;
mod stores_in_pods;
mod turbulence;
mod walkthrough;
mod watcher;
mod watcher_catches;
