//! The one place where errors become HTTP responses: a status from the token, the JSON body
//! `{"error": "<Token>", "message": "..."}`, and the headers the protocol asks for.

use http::{HeaderName, HeaderValue, Response, StatusCode};
use ursula_wire::{ErrorBody, ErrorToken, headers};

use super::marking::{self, Stage, Write};
use super::response::{Body, full};
use crate::engine::{EngineError, ReadError};
use crate::machine::Refusal;
use crate::offset;

#[derive(Debug)]
pub struct ApiError {
    pub token: ErrorToken,
    pub message: String,
    pub headers: Vec<(&'static str, String)>,
    /// How far the request got; with `write`, decides the marker (`marking::marker`).
    pub stage: Stage,
    /// The write that was refused; `None` for reads (and for requests no route takes).
    pub write: Option<Write>,
    /// A `NotLeader` refusal: the leader this node knows of, if any; a `GroupNotHosted` one: a
    /// voter of the group. `http::layers` turns it into a redirect.
    pub leader: Option<u64>,
    /// Answered on the protocol's `__ds` APIs: the body is theirs (`protocol_error_json`),
    /// with these fields beside the code.
    pub protocol: Option<Vec<(&'static str, String)>>,
}

impl ApiError {
    /// A refusal whose stage proves nothing (`Stage::Unknown`, so never marked): the places
    /// that know better say so with `at` (the leadership and hosting checks, admission, the
    /// engine's own checks, the state machine's refusals).
    pub fn new(token: ErrorToken, message: impl Into<String>) -> Self {
        Self {
            token,
            message: message.into(),
            headers: Vec::new(),
            stage: Stage::Unknown,
            write: None,
            leader: None,
            protocol: None,
        }
    }

    /// The refusal as the `__ds` APIs answer it.
    pub fn in_protocol_shape(mut self) -> Self {
        self.protocol.get_or_insert_with(Vec::new);
        self
    }

    /// A field of the `__ds` error body beside its code.
    pub fn with_detail(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.protocol
            .get_or_insert_with(Vec::new)
            .push((name, value.into()));
        self
    }

    /// This node does not lead the group the request is for.
    pub fn not_leader(leader: Option<u64>) -> Self {
        let message = match leader {
            Some(id) => format!("this node does not lead the stream's Raft group; node {id} does"),
            None => "this node does not lead the stream's Raft group, and no leader is known yet (an election may be running)".into(),
        };
        Self {
            leader,
            ..Self::new(ErrorToken::NotLeader, message).at(Stage::BeforeProposal)
        }
    }

    /// A read at a node that believes it leads, and that a quorum did not confirm as the
    /// leader (with its log applied) within the request's deadline (`Engine::ready_to_read`).
    pub fn leader_not_caught_up() -> Self {
        Self::new(
            ErrorToken::NotLeader,
            "this node could not confirm with a quorum that it leads the stream's Raft group \
             (an election may be running)",
        )
        .at(Stage::BeforeProposal)
    }

    pub fn at(mut self, stage: Stage) -> Self {
        self.stage = stage;
        self
    }

    /// Names the write this refusal answers (the first one named stays).
    pub fn during(mut self, write: Option<Write>) -> Self {
        self.write = self.write.or(write);
        self
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    pub fn header(name: &str, problem: impl std::fmt::Display) -> Self {
        Self::new(ErrorToken::InvalidHeader, format!("{name}: {problem}"))
    }

    /// The one place a refusal becomes a response: the token's status, the JSON body, the
    /// protocol's headers and the marker where `marking` says so.
    pub fn into_response(self) -> Response<Body> {
        let status =
            StatusCode::from_u16(self.token.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = match &self.protocol {
            Some(details) => ursula_wire::protocol_error_json(self.token, &self.message, details),
            None => ErrorBody::new(self.token, self.message).to_json(),
        };
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
        if let Some(token) = marking::marker(self.write, self.stage, self.token) {
            map.insert(
                headers::NOT_APPLIED,
                HeaderValue::from_static(token.as_str()),
            );
        }
        if let Some(leader) = self.leader
            && matches!(
                self.token,
                ErrorToken::NotLeader | ErrorToken::GroupNotHosted
            )
        {
            response.extensions_mut().insert(RedirectTo(leader));
        }
        response
    }
}

impl axum::response::IntoResponse for ApiError {
    fn into_response(self) -> axum::response::Response {
        ApiError::into_response(self)
    }
}

/// On a refusal that names the node to go to instead; `http::layers::redirects` turns it
/// into a 307 when it knows that node's client URL.
#[derive(Debug, Clone, Copy)]
pub struct RedirectTo(pub u64);

impl From<crate::admission::Refused> for ApiError {
    fn from(refused: crate::admission::Refused) -> Self {
        Self::new(refused.token, refused.message).at(Stage::Admission)
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
            Refusal::SubscriptionNotFound(_) => ErrorToken::SubscriptionNotFound,
            Refusal::SubscriptionConflict(_) => ErrorToken::SubscriptionConflict,
            Refusal::InvalidSubscription(_) => ErrorToken::InvalidSubscription,
            Refusal::InvalidAck(_) => ErrorToken::InvalidOffset,
            Refusal::WakeFenced { .. } => ErrorToken::Fenced,
            Refusal::AlreadyClaimed { .. } => ErrorToken::AlreadyClaimed,
        };
        let error = Self::new(token, message).at(Stage::Proposed);
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
            Refusal::AlreadyClaimed { holder } => error.with_detail("current_holder", holder),
            _ => error,
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        match error {
            EngineError::Refused(refusal) => refusal.into(),
            EngineError::Storage(message) => Self::new(ErrorToken::Internal, message),
            EngineError::Stopped => Self::new(ErrorToken::Unavailable, "the node is shutting down"),
            // Raft may have taken the write before it found it no longer leads.
            EngineError::NotLeader { leader } => Self::not_leader(leader).at(Stage::Proposed),
            EngineError::Replication(message) => Self::new(ErrorToken::Unavailable, message),
            error @ EngineError::TimedOut(_) => {
                Self::new(ErrorToken::RequestTimeout, error.to_string())
            }
            // The engine's own checks, before anything was proposed.
            error @ EngineError::UncommittedBackpressure { .. } => {
                Self::new(ErrorToken::RaftUncommittedBackpressure, error.to_string())
                    .at(Stage::BeforeProposal)
            }
            error @ EngineError::ColdBackpressure { .. } => {
                Self::new(ErrorToken::ColdBackpressure, error.to_string()).at(Stage::BeforeProposal)
            }
            // Nothing was proposed; the spec marks no such refusal (`marking` decides).
            error @ EngineError::Staging(_) => {
                Self::new(ErrorToken::Unavailable, error.to_string())
            }
        }
    }
}

impl From<crate::subscriptions::change::ChangeError> for ApiError {
    fn from(error: crate::subscriptions::change::ChangeError) -> Self {
        use crate::subscriptions::change::ChangeError;
        match error {
            ChangeError::Engine(error) => error.into(),
            ChangeError::Unauthenticated(message) => {
                Self::new(ErrorToken::Unauthenticated, message).at(Stage::BeforeProposal)
            }
            error @ ChangeError::Unreachable(_) => {
                Self::new(ErrorToken::Unavailable, error.to_string())
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
                Self::new(ErrorToken::Internal, error.to_string())
            }
            // Object storage may be back in a moment; the read can be repeated.
            ReadError::Cold(_) => Self::new(ErrorToken::Unavailable, error.to_string()),
            ReadError::TimedOut(_) => Self::new(ErrorToken::RequestTimeout, error.to_string()),
        }
    }
}
