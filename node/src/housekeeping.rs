//! Background proposals every node makes for the groups it leads.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::{Engine, EngineError, Leadership, now_ms};
use crate::groups::Groups;
use crate::machine::{Command, Refusal};

/// Expiry is checked on every access; this sweep also frees expired streams nobody touches,
/// and (on a replicated node) proposes pending TTL resets from reads. Only a group's leader
/// proposes them; the commands carry its clock to every replica.
pub async fn sweep(engine: Arc<Engine>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if engine.leadership() != Leadership::Here {
            continue;
        }
        if engine.group_status().is_some()
            && let Some(touches) = engine.take_touches()
            && let Err(EngineError::Stopped) = engine.propose(touches).await
        {
            return;
        }
        if let Err(EngineError::Stopped) = engine
            .propose(Command::ExpireDue { now_ms: now_ms() })
            .await
        {
            return;
        }
    }
}

/// The bucket of `/v1/stream/{name}` exists on every cluster: its group's leader creates it
/// once, whichever node that is.
pub async fn ensure_bucket(groups: Arc<Groups>, bucket: String) {
    // A node that does not host the bucket's group leaves it to the voters that do.
    let Ok(engine) = groups.for_bucket(&bucket).cloned() else {
        return;
    };
    loop {
        if engine.bucket(&bucket).is_some() {
            return;
        }
        if engine.leadership() == Leadership::Here {
            match engine
                .propose(Command::CreateBucket {
                    bucket: bucket.clone(),
                })
                .await
            {
                Ok(_) | Err(EngineError::Refused(Refusal::BucketFenced(_))) => return,
                Err(EngineError::Stopped) => return,
                Err(error) => tracing::debug!(%error, "cannot create the compatibility bucket yet"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
