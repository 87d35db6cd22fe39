//! `/admin/membership`: see and change which nodes vote in the Raft groups. Each change is
//! made in every group, by each group's leader (`cluster::membership`); any voter's admin
//! listener takes it.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use http::StatusCode;
use ursula_wire::ErrorToken;
use ursula_wire::admin::{MembershipChanged, NewMember};

use super::{Admin, Answer, Authorized, json, path_error};
use crate::cluster::membership::{ChangeError, Members, MembershipChange};
use crate::config::Peer;
use crate::http::error::ApiError;

/// How long a change waits out leader elections and changes in progress, over all groups.
const PATIENCE: Duration = Duration::from_secs(25);

fn members(admin: &Admin) -> Result<&Members, ApiError> {
    admin.members.as_deref().ok_or_else(|| {
        ApiError::new(
            ErrorToken::NotFound,
            "a single node has no Raft membership: give it raft.peers to make it a voter",
        )
    })
}

pub async fn report(State(admin): State<Arc<Admin>>, _: Authorized) -> Answer {
    let report = members(&admin)?.report();
    Ok(json(
        StatusCode::OK,
        serde_json::to_string(&report).unwrap_or_default(),
    ))
}

pub async fn add_learner(
    State(admin): State<Arc<Admin>>,
    _: Authorized,
    id: Result<Path<u64>, PathRejection>,
    body: bytes::Bytes,
) -> Answer {
    let Path(id) = id.map_err(path_error)?;
    let new: NewMember = serde_json::from_slice(&body).map_err(|error| {
        ApiError::new(
            ErrorToken::InvalidJson,
            format!("the body must be {{\"cluster_url\": ..., \"client_url\": ...}}: {error}"),
        )
    })?;
    for (name, url) in [
        ("cluster_url", &new.cluster_url),
        ("client_url", &new.client_url),
    ] {
        if !(url.starts_with("http://") || url.starts_with("https://")) || url.contains(' ') {
            return Err(ApiError::new(
                ErrorToken::InvalidJson,
                format!("{name} {url:?} is not an http:// or https:// URL"),
            ));
        }
    }
    let peer = Peer {
        id,
        cluster_url: new.cluster_url,
        client_url: new.client_url,
    };
    change(&admin, MembershipChange::AddLearner(peer)).await
}

pub async fn remove(
    State(admin): State<Arc<Admin>>,
    _: Authorized,
    id: Result<Path<u64>, PathRejection>,
) -> Answer {
    let Path(id) = id.map_err(path_error)?;
    change(&admin, MembershipChange::Remove(id)).await
}

pub async fn promote(
    State(admin): State<Arc<Admin>>,
    _: Authorized,
    id: Result<Path<u64>, PathRejection>,
) -> Answer {
    let Path(id) = id.map_err(path_error)?;
    change(&admin, MembershipChange::Promote(id)).await
}

pub async fn demote(
    State(admin): State<Arc<Admin>>,
    _: Authorized,
    id: Result<Path<u64>, PathRejection>,
) -> Answer {
    let Path(id) = id.map_err(path_error)?;
    change(&admin, MembershipChange::Demote(id)).await
}

async fn change(admin: &Admin, change: MembershipChange) -> Answer {
    let node = change.node();
    let groups = members(admin)?
        .change(&change, PATIENCE)
        .await
        .map_err(|error| match error {
            ChangeError::Refused(why) => ApiError::new(ErrorToken::MembershipConflict, why),
            ChangeError::NotLeader(_) | ChangeError::Failed(_) => {
                ApiError::new(ErrorToken::Unavailable, error.to_string())
            }
        })?;
    tracing::info!(node, role = change.role(), groups, "membership changed");
    let body = MembershipChanged {
        node,
        role: change.role().to_owned(),
        groups,
    };
    Ok(json(
        StatusCode::OK,
        serde_json::to_string(&body).unwrap_or_default(),
    ))
}

/// This voter takes over its share of the groups' leadership from the busiest leaders (after
/// a growth, the new voters lead nothing).
pub async fn claim_leadership(State(admin): State<Arc<Admin>>, _: Authorized) -> Answer {
    let claimed = members(&admin)?
        .claim_leadership()
        .await
        .map_err(|error| ApiError::new(ErrorToken::Unavailable, error.to_string()))?;
    tracing::info!(groups = ?claimed, "took over the leadership of groups");
    Ok(json(
        StatusCode::OK,
        serde_json::json!({ "claimed": claimed }).to_string(),
    ))
}
