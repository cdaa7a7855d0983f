//! `leasehold version`: this binary's version and, when a cluster is
//! reachable, the version of each operator installed in it (the tag of its
//! Deployment's image, found by the chart's labels; see [`super::installed`]).
//! A cluster that cannot be read is a line saying so, not a failure.

use super::ClusterArgs;
use super::installed::{self, Operator};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Print this binary's version only, without reading the cluster.
    #[arg(long, env = "LEASEHOLD_VERSION_CLIENT_ONLY")]
    pub client_only: bool,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// This binary's version.
pub(crate) const CLIENT: &str = env!("CARGO_PKG_VERSION");

pub(crate) async fn run(args: Args) {
    let operators = match args.client_only {
        true => None,
        false => Some(look(&args.cluster).await),
    };
    print!("{}", render(operators.as_ref()));
}

async fn look(cluster: &ClusterArgs) -> Result<Vec<Operator>, String> {
    let client = cluster.client().await.map_err(|e| crate::api::errors::chain(&e))?;
    installed::operators(&client, None, None)
        .await
        .map_err(|e| crate::api::errors::chain(&e))
}

/// The lines printed: the client's version, then one line per operator
/// found, or one saying why its version is unknown.
pub(crate) fn render(operators: Option<&Result<Vec<Operator>, String>>) -> String {
    let mut text = format!("client: {CLIENT}\n");
    match operators {
        None => {}
        Some(Err(why)) => text.push_str(&format!("operator: unknown (cannot read the cluster: {why})\n")),
        Some(Ok(found)) if found.is_empty() => text.push_str(&format!(
            "operator: unknown (no Deployment labelled {} in the cluster)\n",
            installed::selector(None)
        )),
        Some(Ok(found)) => {
            for operator in found {
                let version = operator.version().unwrap_or("unknown (its image has no tag)");
                let image = operator.image.as_deref().unwrap_or("no image");
                text.push_str(&format!("operator: {version} ({}, image {image})\n", operator.id()));
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_says_what_it_knows() {
        let operator = Operator {
            namespace: "ops".into(),
            name: "other-leasehold-operator".into(),
            instance: Some("other".into()),
            image: Some("ghcr.io/leasehold/leasehold:0.2.0".into()),
            env: Default::default(),
        };
        assert_eq!(render(None), format!("client: {CLIENT}\n"));
        assert_eq!(
            render(Some(&Ok(vec![operator]))),
            format!(
                "client: {CLIENT}\noperator: 0.2.0 (Deployment ops/other-leasehold-operator, image \
                 ghcr.io/leasehold/leasehold:0.2.0)\n"
            )
        );
        assert!(render(Some(&Ok(vec![]))).ends_with(
            "operator: unknown (no Deployment labelled app.kubernetes.io/name=leasehold,\
             app.kubernetes.io/component=operator in the cluster)\n"
        ));
        assert!(
            render(Some(&Err("no Kubernetes configuration".into())))
                .ends_with("operator: unknown (cannot read the cluster: no Kubernetes configuration)\n")
        );
    }
}
