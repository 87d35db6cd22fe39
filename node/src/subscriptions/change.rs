//! A change of a subscription as a route asks for it, made by the group's leader: the voter a
//! client reached carries it there over the cluster listener when it does not lead (a redirect
//! would lose a wake's bearer token: clients drop `Authorization` when a redirect leaves the
//! origin). The leader checks the token, so that a follower that has not yet applied a new
//! subscription refuses nothing it should take.

use serde::{Deserialize, Serialize};

use super::Subscriptions;
use crate::engine::{Engine, EngineError};
use crate::machine::subscription::SubscriptionAction;
use crate::machine::{Command, Outcome, Refusal, SubscriptionCommand, SubscriptionOutcome};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Change {
    pub command: SubscriptionCommand,
    /// The bearer token a wake's callback, ack or release came with.
    pub token: Option<String>,
}

#[derive(Debug, Clone, thiserror::Error, Serialize, Deserialize)]
pub enum ChangeError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Unauthenticated(String),
    /// The leader could not be asked; the change may not have been made.
    #[error("the group's leader could not be reached: {0}")]
    Unreachable(String),
}

impl Subscriptions {
    /// Makes the change in `engine`'s group, which this node leads.
    pub async fn change_here(
        &self,
        engine: &Engine,
        change: Change,
    ) -> Result<SubscriptionOutcome, ChangeError> {
        let command = change.command;
        let wake = match &command.action {
            SubscriptionAction::Ack { wake, .. } | SubscriptionAction::Release { wake } => {
                Some(wake)
            }
            _ => None,
        };
        if let Some(wake) = wake {
            let sub = engine
                .subscription(&command.bucket, &command.id)
                .ok_or_else(|| {
                    EngineError::from(Refusal::SubscriptionNotFound(command.id.clone()))
                })?;
            match &change.token {
                Some(token) if self.key.check_wake_token(&sub, wake, token) => {}
                Some(_) => {
                    return Err(ChangeError::Unauthenticated(
                        "the bearer token is not this wake's token".into(),
                    ));
                }
                None => {
                    return Err(ChangeError::Unauthenticated(
                        "a wake's callback, ack and release need its token: Authorization: Bearer <token>"
                            .into(),
                    ));
                }
            }
        }
        match engine.propose(Command::Subscription(command)).await? {
            Outcome::Subscription(outcome) => Ok(outcome),
            _ => Err(
                EngineError::Storage("unexpected outcome of a subscription change".into()).into(),
            ),
        }
    }
}
