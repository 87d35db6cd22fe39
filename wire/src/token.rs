/// Every stable error token Ursula sends, in the `error` field of the JSON body and, for the
/// refusals that applied nothing, as the value of `x-ursula-not-applied`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorToken {
    // 400
    InvalidBucketId,
    InvalidStreamName,
    InvalidOffset,
    InvalidHeader,
    InvalidJson,
    EmptyBody,
    MissingContentType,
    InvalidProducer,
    InvalidForkRequest,
    // 404
    NotFound,
    BucketNotFound,
    StreamNotFound,
    SnapshotNotFound,
    ForkSourceNotFound,
    // 405
    MethodNotAllowed,
    // 401, 402, 403
    Unauthenticated,
    QuotaExhausted,
    Forbidden,
    ProducerEpochFenced,
    // 409
    StreamConflict,
    ContentTypeMismatch,
    StreamClosed,
    StreamSeqConflict,
    ProducerSeqGap,
    ForkSourceDeleted,
    SnapshotConflict,
    /// An admin membership change that cannot be made as asked (e.g. promoting a node that
    /// is not a learner); nothing changed.
    MembershipConflict,
    // 410
    StreamDeleted,
    OffsetNotRetained,
    // 413
    RequestBodyTooLarge,
    // 429
    TooManyProducers,
    RateLimited,
    // 500
    Internal,
    // 503
    Unavailable,
    WalDiskPressure,
    RaftLogPressure,
    IngressBodyBytesLimitReached,
    NotLeader,
    GroupNotHosted,
    RaftUncommittedBackpressure,
    ColdBackpressure,
    LeaderNotFound,
    UpstreamUnavailable,
    /// No answer within the node's `server.request_timeout` (or the gateway's
    /// `--request-timeout`); the write may still apply.
    RequestTimeout,
}

impl ErrorToken {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InvalidBucketId => "InvalidBucketId",
            Self::InvalidStreamName => "InvalidStreamName",
            Self::InvalidOffset => "InvalidOffset",
            Self::InvalidHeader => "InvalidHeader",
            Self::InvalidJson => "InvalidJson",
            Self::EmptyBody => "EmptyBody",
            Self::MissingContentType => "MissingContentType",
            Self::InvalidProducer => "InvalidProducer",
            Self::InvalidForkRequest => "InvalidForkRequest",
            Self::NotFound => "NotFound",
            Self::BucketNotFound => "BucketNotFound",
            Self::StreamNotFound => "StreamNotFound",
            Self::SnapshotNotFound => "SnapshotNotFound",
            Self::ForkSourceNotFound => "ForkSourceNotFound",
            Self::MethodNotAllowed => "MethodNotAllowed",
            Self::Unauthenticated => "Unauthenticated",
            Self::QuotaExhausted => "QuotaExhausted",
            Self::Forbidden => "Forbidden",
            Self::ProducerEpochFenced => "ProducerEpochFenced",
            Self::StreamConflict => "StreamConflict",
            Self::ContentTypeMismatch => "ContentTypeMismatch",
            Self::StreamClosed => "StreamClosed",
            Self::StreamSeqConflict => "StreamSeqConflict",
            Self::ProducerSeqGap => "ProducerSeqGap",
            Self::ForkSourceDeleted => "ForkSourceDeleted",
            Self::SnapshotConflict => "SnapshotConflict",
            Self::MembershipConflict => "MembershipConflict",
            Self::StreamDeleted => "StreamDeleted",
            Self::OffsetNotRetained => "OffsetNotRetained",
            Self::RequestBodyTooLarge => "RequestBodyTooLarge",
            Self::TooManyProducers => "TooManyProducers",
            Self::RateLimited => "RateLimited",
            Self::Internal => "Internal",
            Self::Unavailable => "Unavailable",
            Self::WalDiskPressure => "WalDiskPressure",
            Self::RaftLogPressure => "RaftLogPressure",
            Self::IngressBodyBytesLimitReached => "IngressBodyBytesLimitReached",
            Self::NotLeader => "NotLeader",
            Self::GroupNotHosted => "GroupNotHosted",
            Self::RaftUncommittedBackpressure => "RaftUncommittedBackpressure",
            Self::ColdBackpressure => "ColdBackpressure",
            Self::LeaderNotFound => "LeaderNotFound",
            Self::UpstreamUnavailable => "UpstreamUnavailable",
            Self::RequestTimeout => "RequestTimeout",
        }
    }

    /// The HTTP status each token is sent with. `NotLeader` and `GroupNotHosted` are also sent
    /// as 307 redirects; this is their status when no redirect target is known.
    pub const fn status(self) -> u16 {
        match self {
            Self::InvalidBucketId
            | Self::InvalidStreamName
            | Self::InvalidOffset
            | Self::InvalidHeader
            | Self::InvalidJson
            | Self::EmptyBody
            | Self::MissingContentType
            | Self::InvalidProducer
            | Self::InvalidForkRequest => 400,
            Self::NotFound
            | Self::BucketNotFound
            | Self::StreamNotFound
            | Self::SnapshotNotFound
            | Self::ForkSourceNotFound => 404,
            Self::MethodNotAllowed => 405,
            Self::Unauthenticated => 401,
            Self::QuotaExhausted => 402,
            Self::ProducerEpochFenced | Self::Forbidden => 403,
            Self::StreamConflict
            | Self::ContentTypeMismatch
            | Self::StreamClosed
            | Self::StreamSeqConflict
            | Self::ProducerSeqGap
            | Self::ForkSourceDeleted
            | Self::SnapshotConflict
            | Self::MembershipConflict => 409,
            Self::StreamDeleted | Self::OffsetNotRetained => 410,
            Self::RequestBodyTooLarge => 413,
            Self::TooManyProducers | Self::RateLimited => 429,
            Self::Internal => 500,
            Self::Unavailable
            | Self::WalDiskPressure
            | Self::RaftLogPressure
            | Self::IngressBodyBytesLimitReached
            | Self::NotLeader
            | Self::GroupNotHosted
            | Self::RaftUncommittedBackpressure
            | Self::ColdBackpressure
            | Self::LeaderNotFound
            | Self::UpstreamUnavailable
            | Self::RequestTimeout => 503,
        }
    }
}

impl std::fmt::Display for ErrorToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
