//! The `BucketPurge` reconciler: purge the bucket through a voter's admin API and record the
//! outcome. Phases only move forward (`Pending` → `Purging` → `Succeeded` | `Failed`; the CRD
//! enforces it too); a finished purge is never repeated, and deleting the resource touches no
//! data.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use crate::controller::{Context, Error};
use crate::crd::{BucketPurge, BucketPurgeStatus, PurgePhase, UrsulaCluster};

/// Tries before a purge is reported `Failed`; each try goes to the next voter.
const ATTEMPTS: u32 = 10;

pub async fn reconcile(purge: Arc<BucketPurge>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = purge.name_any();
    let ns = purge
        .namespace()
        .ok_or_else(|| Error::NoNamespace(name.clone()))?;
    // The event that started this reconcile may predate the status this operator wrote last
    // (a purge writes `Purging`, then its outcome): read the resource itself, so that a
    // finished purge is never run again (a second run finds the bucket empty and would
    // overwrite the outcome with zero streams).
    let purges: Api<BucketPurge> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(purge) = purges.get_opt(&name).await? else {
        return Ok(Action::await_change());
    };
    let status = purge.status.clone().unwrap_or_default();
    if matches!(
        status.phase,
        Some(PurgePhase::Succeeded | PurgePhase::Failed)
    ) {
        return Ok(Action::await_change());
    }
    let clusters: Api<UrsulaCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(cluster) = clusters.get_opt(&purge.spec.cluster).await? else {
        write(
            &ctx,
            &ns,
            &name,
            BucketPurgeStatus {
                phase: Some(PurgePhase::Pending),
                reason: Some(format!(
                    "UrsulaCluster {} does not exist",
                    purge.spec.cluster
                )),
                purged_streams: None,
            },
        )
        .await?;
        return Ok(Action::requeue(Duration::from_secs(30)));
    };
    if status.phase != Some(PurgePhase::Purging) {
        write(
            &ctx,
            &ns,
            &name,
            BucketPurgeStatus {
                phase: Some(PurgePhase::Purging),
                reason: Some(format!("purging bucket {}", purge.spec.bucket)),
                purged_streams: None,
            },
        )
        .await?;
    }
    // The cluster's reconciler makes its admin token; until it has, the purge waits.
    let token = match crate::credentials::admin_token_of(&ctx.client, &ns, &cluster).await {
        Ok(token) => token,
        Err(error) => {
            tracing::info!(purge = %name, %error, "no admin token yet; retrying");
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
    };
    let mut last_error = String::new();
    for attempt in 0..ATTEMPTS {
        let ordinal = (attempt % u32::from(cluster.spec.voters.max(1))) as u8;
        match ctx
            .nodes
            .purge(&cluster, ordinal, &purge.spec.bucket, &token)
            .await
        {
            Ok(done) => {
                write(
                    &ctx,
                    &ns,
                    &name,
                    BucketPurgeStatus {
                        phase: Some(PurgePhase::Succeeded),
                        reason: Some(format!(
                            "bucket {} purged ({} streams) and fenced",
                            done.bucket, done.purged_streams
                        )),
                        purged_streams: Some(done.purged_streams),
                    },
                )
                .await?;
                return Ok(Action::await_change());
            }
            Err(error) => {
                tracing::warn!(purge = %name, %error, "purge attempt failed; trying the next voter");
                last_error = error.to_string();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    write(
        &ctx,
        &ns,
        &name,
        BucketPurgeStatus {
            phase: Some(PurgePhase::Failed),
            reason: Some(format!("no voter could purge the bucket: {last_error}")),
            purged_streams: None,
        },
    )
    .await?;
    Ok(Action::await_change())
}

async fn write(
    ctx: &Context,
    ns: &str,
    name: &str,
    status: BucketPurgeStatus,
) -> Result<(), Error> {
    Ok(crate::apply::apply_status::<BucketPurge>(&ctx.client, ns, name, &status).await?)
}

pub fn error_policy(_purge: Arc<BucketPurge>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "bucket purge reconcile failed; retrying");
    Action::requeue(Duration::from_secs(10))
}
