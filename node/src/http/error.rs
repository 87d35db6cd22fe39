//! The one place where errors become HTTP responses: a status from the token, the JSON body
//! `{"error": "<Token>", "message": "..."}`, and the headers the protocol asks for.

use http::{HeaderName, HeaderValue, Response, StatusCode};
use ursula_wire::{ErrorBody, ErrorToken, headers};

use super::response::{Body, full};
use crate::engine::{EngineError, ReadError};
use crate::machine::Refusal;
use crate::offset;

#[derive(Debug)]
pub struct ApiError {
    pub token: ErrorToken,
    pub message: String,
    pub headers: Vec<(&'static str, String)>,
    /// Raised while reading the request, before anything was proposed (as opposed to a
    /// refusal by the state machine or a storage failure).
    pub before_proposal: bool,
    /// A `NotLeader` refusal: the leader this node knows of, if any. `http::handle` turns it
    /// into a redirect.
    pub leader: Option<u64>,
    /// Overrides the token's status (a `NotLeader` redirect is 307).
    pub status: Option<StatusCode>,
}

impl ApiError {
    pub fn new(token: ErrorToken, message: impl Into<String>) -> Self {
        Self {
            token,
            message: message.into(),
            headers: Vec::new(),
            before_proposal: true,
            leader: None,
            status: None,
        }
    }

    /// This node does not lead the group the request is for.
    pub fn not_leader(leader: Option<u64>) -> Self {
        let message = match leader {
            Some(id) => format!("this node does not lead the stream's Raft group; node {id} does"),
            None => "this node does not lead the stream's Raft group, and no leader is known yet (an election may be running)".into(),
        };
        Self {
            leader,
            ..Self::new(ErrorToken::NotLeader, message)
        }
    }

    /// Sent before anything was proposed, but not one of the refusals the spec marks.
    pub fn unmarked(self) -> Self {
        self.after_proposal()
    }

    /// An error the state machine or storage answered: a write may have been proposed.
    pub fn after_proposal(mut self) -> Self {
        self.before_proposal = false;
        self
    }

    /// Marks a write refused before anything of it was proposed: nothing of it can apply.
    pub fn marked_if_unproposed(mut self) -> Self {
        let marked = self
            .headers
            .iter()
            .any(|(name, _)| *name == headers::NOT_APPLIED);
        // Internal failures and timeouts prove nothing, wherever they happened.
        let internal = matches!(
            self.token,
            ErrorToken::Internal | ErrorToken::Unavailable | ErrorToken::RequestTimeout
        );
        if self.before_proposal && !marked && !internal {
            self.headers
                .push((headers::NOT_APPLIED, self.token.as_str().to_owned()));
        }
        self
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    pub fn header(name: &str, problem: impl std::fmt::Display) -> Self {
        Self::new(ErrorToken::InvalidHeader, format!("{name}: {problem}"))
    }

    pub fn into_response(self) -> Response<Body> {
        let status = self.status.unwrap_or_else(|| {
            StatusCode::from_u16(self.token.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        });
        let body = ErrorBody::new(self.token, self.message).to_json();
        let mut response = Response::new(full(body));
        *response.status_mut() = status;
        let map = response.headers_mut();
        map.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            map.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        for (name, value) in self.headers {
            if let Ok(value) = HeaderValue::from_str(&value) {
                map.insert(HeaderName::from_static(name), value);
            }
        }
        response
    }
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        let message = refusal.to_string();
        let token = match &refusal {
            Refusal::BucketNotFound(_) | Refusal::BucketFenced(_) => ErrorToken::BucketNotFound,
            Refusal::StreamNotFound(_) => ErrorToken::StreamNotFound,
            Refusal::StreamDeleted(_) => ErrorToken::StreamDeleted,
            Refusal::StreamConflict { .. } => ErrorToken::StreamConflict,
            Refusal::ContentTypeMismatch { .. } => ErrorToken::ContentTypeMismatch,
            Refusal::StreamClosed { .. } => ErrorToken::StreamClosed,
            Refusal::StreamSeqConflict { .. } => ErrorToken::StreamSeqConflict,
            Refusal::ProducerFenced { .. } => ErrorToken::ProducerEpochFenced,
            Refusal::ProducerEpochSeqNotZero { .. } => ErrorToken::InvalidProducer,
            Refusal::ProducerSeqGap { .. } => ErrorToken::ProducerSeqGap,
            Refusal::TooManyProducers { .. } => ErrorToken::TooManyProducers,
            Refusal::ForkSourceNotFound(_) => ErrorToken::ForkSourceNotFound,
            Refusal::ForkSourceDeleted(_) => ErrorToken::ForkSourceDeleted,
            Refusal::OffsetBeyondTail { .. } => ErrorToken::InvalidOffset,
            Refusal::OffsetNotRetained { .. } => ErrorToken::OffsetNotRetained,
            Refusal::InvalidFork(_) => ErrorToken::InvalidForkRequest,
            Refusal::SnapshotConflict { .. } => ErrorToken::SnapshotConflict,
        };
        let error = Self::new(token, message).after_proposal();
        match refusal {
            Refusal::StreamClosed { next_offset } => error
                .with_header(headers::STREAM_CLOSED, "true")
                .with_header(headers::STREAM_NEXT_OFFSET, offset::format(next_offset)),
            Refusal::ProducerFenced { current, .. } => {
                error.with_header(headers::PRODUCER_EPOCH, current.to_string())
            }
            Refusal::ProducerSeqGap { expected, received } => error
                .with_header(headers::PRODUCER_EXPECTED_SEQ, expected.to_string())
                .with_header(headers::PRODUCER_RECEIVED_SEQ, received.to_string()),
            Refusal::OffsetNotRetained { retained_from, .. } => error.with_header(
                headers::STREAM_RETAINED_OFFSET,
                offset::format(retained_from),
            ),
            _ => error,
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        match error {
            EngineError::Refused(refusal) => refusal.into(),
            EngineError::Storage(message) => {
                Self::new(ErrorToken::Internal, message).after_proposal()
            }
            EngineError::Stopped => {
                Self::new(ErrorToken::Unavailable, "the node is shutting down").after_proposal()
            }
            // Raft may have taken the write before it found it no longer leads.
            EngineError::NotLeader { leader } => Self::not_leader(leader).after_proposal(),
            EngineError::Replication(message) => {
                Self::new(ErrorToken::Unavailable, message).after_proposal()
            }
            error @ EngineError::TimedOut(_) => {
                Self::new(ErrorToken::RequestTimeout, error.to_string()).after_proposal()
            }
            // Refused before anything was proposed: marked by the write path.
            error @ EngineError::UncommittedBackpressure { .. } => {
                Self::new(ErrorToken::RaftUncommittedBackpressure, error.to_string())
            }
            error @ EngineError::ColdBackpressure { .. } => {
                Self::new(ErrorToken::ColdBackpressure, error.to_string())
            }
            // Nothing was proposed, but the spec marks no such refusal.
            error @ EngineError::Staging(_) => {
                Self::new(ErrorToken::Unavailable, error.to_string()).after_proposal()
            }
        }
    }
}

impl From<ReadError> for ApiError {
    fn from(error: ReadError) -> Self {
        match error {
            ReadError::NotRetained {
                offset,
                retained_from,
            } => Refusal::OffsetNotRetained {
                offset,
                retained_from,
            }
            .into(),
            ReadError::NotBoundary(_) => Self::new(ErrorToken::InvalidOffset, error.to_string()),
            ReadError::Removed(path) => Refusal::StreamNotFound(path).into(),
            ReadError::MissingSource(_) | ReadError::Missing { .. } | ReadError::Storage(_) => {
                Self::new(ErrorToken::Internal, error.to_string()).after_proposal()
            }
            // Object storage may be back in a moment; the read can be repeated.
            ReadError::Cold(_) => Self::new(ErrorToken::Unavailable, error.to_string()),
            ReadError::TimedOut(_) => {
                Self::new(ErrorToken::RequestTimeout, error.to_string()).after_proposal()
            }
        }
    }
}
