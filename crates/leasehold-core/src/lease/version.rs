//! Versions of candidates, and the rules that order leadership by them
//! (issue 16): a lease can prefer the newest or the oldest version, and a
//! version fence keeps leadership from ever moving back to older code.
//!
//! The order is the `revision`, an integer that grows with every rollout.
//! Inside Kubernetes it is the owning ReplicaSet's
//! `deployment.kubernetes.io/revision` annotation: the Deployment controller
//! sets it to one more than the highest revision of the Deployment's
//! ReplicaSets whenever it makes a ReplicaSet current, including on a
//! rollback, which therefore counts as newer (kubernetes
//! `pkg/controller/deployment/util/deployment_util.go`, `SetNewReplicaSetAnnotations`
//! and `MaxRevision`). A `pod-template-hash` names a version but has no
//! order, and an order by first sight in the store would make a rollback
//! "older" and fence it out for good, so neither is used to compare.
//! The `name` (the pod-template-hash and app image, or `--version`) says
//! which code it is, for people; two candidates of the same revision are the
//! same version.

use std::fmt;

use serde::{Deserialize, Serialize};
use tracing::info;

use super::ElectorControl;

/// The version a candidate runs: ordered by `revision`; `name` is for people.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Version {
    pub revision: u64,
    pub name: String,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name.is_empty() {
            write!(f, "revision {}", self.revision)
        } else {
            write!(f, "{} (revision {})", self.name, self.revision)
        }
    }
}

/// Which version should lead when several are live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Prefer {
    /// Any candidate may lead (the behaviour before versions existed).
    #[default]
    None,
    /// Leadership moves to the newest version once per rollout.
    Newest,
    /// Leadership stays on the oldest version until none of it is left.
    Oldest,
}

impl Prefer {
    /// Whether a candidate of version `mine` should step aside for a live,
    /// healthy candidate of version `other`: with `Newest` for a newer one,
    /// with `Oldest` for an older one. A candidate without a version yields
    /// to every versioned one, and nobody yields to it.
    pub fn yields_to(self, mine: Option<&Version>, other: Option<&Version>) -> bool {
        let Some(other) = other else { return false };
        let Some(mine) = mine else {
            return self != Prefer::None;
        };
        match self {
            Prefer::None => false,
            Prefer::Newest => other.revision > mine.revision,
            Prefer::Oldest => other.revision < mine.revision,
        }
    }
}

/// Not one of `None`, `Newest`, `Oldest`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a leadership preference: use None, Newest or Oldest")]
pub struct InvalidPrefer(pub String);

impl std::str::FromStr for Prefer {
    type Err = InvalidPrefer;

    /// The resource's spelling, in any case (`--prefer newest`).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_lowercase().as_str() {
            "none" => Ok(Prefer::None),
            "newest" => Ok(Prefer::Newest),
            "oldest" => Ok(Prefer::Oldest),
            _ => Err(InvalidPrefer(text.to_string())),
        }
    }
}

impl Prefer {
    /// Why a candidate of version `mine` should stand aside, given the
    /// other live, healthy candidates `(name, version)`: the first one it
    /// [yields to](Self::yields_to), named. `None`: campaign.
    pub fn stand_aside_for<'a>(
        self,
        mine: Option<&Version>,
        peers: impl IntoIterator<Item = (&'a str, Option<&'a Version>)>,
    ) -> Option<String> {
        let (name, version) = peers
            .into_iter()
            .filter(|(_, version)| self.yields_to(mine, *version))
            .max_by_key(|(name, version)| {
                let revision = version.map_or(0, |v| v.revision);
                // Newest: the newest first; Oldest: the oldest first.
                let order = if self == Prefer::Oldest {
                    u64::MAX - revision
                } else {
                    revision
                };
                (order, std::cmp::Reverse(*name))
            })?;
        let version = version.map_or_else(|| "no version".to_string(), ToString::to_string);
        let which = if self == Prefer::Oldest { "older" } else { "newer" };
        Some(format!(
            "the lease prefers {self:?} and {name} runs {which} {version}, and is healthy"
        ))
    }
}

/// A candidate's peer watch: each time the other live, healthy candidates
/// or the row's recorded version change, it tells the elector to stand
/// aside (naming why) or to campaign, by [`Prefer::stand_aside_for`]. The
/// one place that turns peers into the elector's stand-aside switch: the
/// sidecar's pod watch (`sidecar::versions::follow_peers`) and the
/// simulation's rollout schedule both drive it.
///
/// With the version fence, a peer the fence refuses (older than the
/// recorded version) cannot lead, so nobody stands aside for it: with
/// `Oldest`, an old pod whose app turns ready again after a newer version
/// has led would otherwise hold every newer candidate back while itself
/// fenced out, and the lease would have no leader until that pod went.
#[derive(Debug)]
pub struct PeerWatch {
    prefer: Prefer,
    mine: Option<Version>,
    fence: bool,
    control: ElectorControl,
    /// The live, healthy peers last seen, `(name, version)`.
    live: Vec<(String, Option<Version>)>,
    /// The version the lease row records, as the elector last read it.
    recorded: Option<Version>,
    /// The reason last given to the elector; `None`: campaigning.
    standing: Option<String>,
    /// The simulation's mutant: stand aside for peers the fence refuses.
    flawed: bool,
}

impl PeerWatch {
    pub fn new(prefer: Prefer, mine: Option<Version>, fence: bool, control: ElectorControl) -> Self {
        PeerWatch {
            prefer,
            mine,
            fence,
            control,
            live: Vec::new(),
            recorded: None,
            standing: None,
            flawed: false,
        }
    }

    /// The simulation's mutant `stand-aside-for-fenced-peers`
    /// ([`super::seams`]).
    #[doc(hidden)]
    pub fn flawed(self) -> Self {
        PeerWatch { flawed: true, ..self }
    }

    /// Why the elector was last told to stand aside; `None`: campaigning.
    pub fn standing(&self) -> Option<&str> {
        self.standing.as_deref()
    }

    /// The live, healthy peers now (this candidate not among them). True
    /// when the decision changed.
    pub fn peers(&mut self, live: Vec<(String, Option<Version>)>) -> bool {
        self.live = live;
        self.decide()
    }

    /// The version the lease row records, from the elector's latest read
    /// (`LeaderState::holder_version`). True when the decision changed.
    pub fn recorded(&mut self, recorded: Option<&Version>) -> bool {
        if self.recorded.as_ref() == recorded {
            return false;
        }
        self.recorded = recorded.cloned();
        self.decide()
    }

    fn decide(&mut self) -> bool {
        let recorded = self.recorded.as_ref();
        // A peer that could lead: the fence (when on) lets it acquire.
        let can_lead = |version: Option<&Version>| {
            Claim {
                holder: "",
                version,
                fence: self.fence && !self.flawed,
            }
            .fenced_by(recorded)
            .is_none()
        };
        let peers = self
            .live
            .iter()
            .map(|(name, version)| (name.as_str(), version.as_ref()))
            .filter(|(_, version)| can_lead(*version));
        let why = self.prefer.stand_aside_for(self.mine.as_ref(), peers);
        if why == self.standing {
            return false;
        }
        match &why {
            Some(why) => info!(%why, "standing aside"),
            None => info!("no candidate of a preferred version can lead; campaigning"),
        }
        self.control.stand_aside(why.clone());
        self.standing = why;
        true
    }
}

/// How a lease treats versions: the preference and the fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VersionPolicy {
    pub prefer: Prefer,
    /// Once a revision has led, no lower revision may acquire the lease.
    pub fence: bool,
}

/// Who asks to acquire, with the version they would record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim<'a> {
    pub holder: &'a str,
    pub version: Option<&'a Version>,
    /// Refuse the acquisition if it would move leadership to a lower revision.
    pub fence: bool,
}

impl<'a> Claim<'a> {
    /// A claim that records no version and ignores the fence: leasehold
    /// before versions.
    pub fn unversioned(holder: &'a str) -> Self {
        Claim {
            holder,
            version: None,
            fence: false,
        }
    }

    /// Why the fence refuses this claim on a row whose last holder ran
    /// `recorded` (kept across releases, like the term), or `None` when it
    /// may acquire. The one statement of the rule: the memory and Spanner
    /// stores call it inside their transaction, the PostgreSQL statement and
    /// the Redis script say the same in their language, and the elector
    /// calls it to explain why it stays a follower. A candidate without a
    /// version cannot show it is not older, so it is refused once a
    /// versioned candidate has led.
    pub fn fenced_by(&self, recorded: Option<&Version>) -> Option<String> {
        if !self.fence {
            return None;
        }
        let recorded = recorded?;
        match self.version {
            Some(mine) if mine.revision >= recorded.revision => None,
            Some(mine) => Some(format!("version fence: {recorded} has led, and {mine} is older")),
            None => Some(format!(
                "version fence: {recorded} has led, and this candidate has no version"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(revision: u64) -> Version {
        Version {
            revision,
            name: format!("hash{revision}"),
        }
    }

    #[test]
    fn the_fence_refuses_only_lower_revisions() {
        let fenced = |mine: Option<&Version>, recorded: Option<&Version>| {
            Claim {
                holder: "a",
                version: mine,
                fence: true,
            }
            .fenced_by(recorded)
        };
        assert_eq!(fenced(Some(&v(2)), Some(&v(2))), None, "the same revision leads again");
        assert_eq!(fenced(Some(&v(3)), Some(&v(2))), None, "a newer one takes over");
        assert_eq!(fenced(Some(&v(1)), None), None, "nothing recorded yet");
        let refused = fenced(Some(&v(1)), Some(&v(2))).unwrap();
        assert_eq!(
            refused,
            "version fence: hash2 (revision 2) has led, and hash1 (revision 1) is older"
        );
        assert!(fenced(None, Some(&v(1))).unwrap().contains("has no version"));
        let unfenced = Claim {
            fence: false,
            ..Claim::unversioned("a")
        };
        assert_eq!(unfenced.fenced_by(Some(&v(9))), None);
    }

    #[test]
    fn a_candidate_stands_aside_naming_the_peer_it_yields_to() {
        let (one, two, three) = (v(1), v(2), v(3));
        let peers = [("web-a", Some(&two)), ("web-b", Some(&three)), ("web-c", None)];
        assert_eq!(
            Prefer::Newest.stand_aside_for(Some(&one), peers).as_deref(),
            Some("the lease prefers Newest and web-b runs newer hash3 (revision 3), and is healthy")
        );
        assert_eq!(Prefer::Newest.stand_aside_for(Some(&three), peers), None);
        assert_eq!(Prefer::None.stand_aside_for(Some(&one), peers), None);
        assert_eq!(
            Prefer::Oldest.stand_aside_for(Some(&three), peers).as_deref(),
            Some("the lease prefers Oldest and web-a runs older hash2 (revision 2), and is healthy")
        );
        assert_eq!("NEWEST".parse::<Prefer>(), Ok(Prefer::Newest));
        assert_eq!(
            "latest".parse::<Prefer>().unwrap_err().to_string(),
            "\"latest\" is not a leadership preference: use None, Newest or Oldest"
        );
    }

    #[test]
    fn newest_yields_to_newer_and_oldest_to_older() {
        assert!(Prefer::Newest.yields_to(Some(&v(1)), Some(&v(2))));
        assert!(!Prefer::Newest.yields_to(Some(&v(2)), Some(&v(2))));
        assert!(!Prefer::Newest.yields_to(Some(&v(2)), Some(&v(1))));
        assert!(Prefer::Oldest.yields_to(Some(&v(2)), Some(&v(1))));
        assert!(!Prefer::Oldest.yields_to(Some(&v(1)), Some(&v(2))));
        assert!(!Prefer::None.yields_to(Some(&v(1)), Some(&v(2))));
        assert!(Prefer::Newest.yields_to(None, Some(&v(1))), "unversioned yields");
        assert!(
            !Prefer::Newest.yields_to(Some(&v(1)), None),
            "nobody yields to unversioned"
        );
        assert!(!Prefer::None.yields_to(None, Some(&v(1))));
    }
}
