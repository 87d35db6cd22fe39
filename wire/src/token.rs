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
    /// A subscription body the protocol does not allow (type, pattern, lease, wake stream).
    InvalidSubscription,
    /// A webhook URL that could reach something private (server-side request forgery), or
    /// not https outside loopback.
    WebhookUrlRejected,
    // 404
    NotFound,
    BucketNotFound,
    StreamNotFound,
    SnapshotNotFound,
    ForkSourceNotFound,
    SubscriptionNotFound,
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
    SubscriptionConflict,
    /// A wake acknowledged, released or issued again since: its ID or generation is stale.
    Fenced,
    /// A pull-wake claim while another worker's lease runs.
    AlreadyClaimed,
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
            Self::InvalidSubscription => "InvalidSubscription",
            Self::WebhookUrlRejected => "WebhookUrlRejected",
            Self::SubscriptionNotFound => "SubscriptionNotFound",
            Self::SubscriptionConflict => "SubscriptionConflict",
            Self::Fenced => "Fenced",
            Self::AlreadyClaimed => "AlreadyClaimed",
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
            | Self::InvalidForkRequest
            | Self::InvalidSubscription
            | Self::WebhookUrlRejected => 400,
            Self::NotFound
            | Self::BucketNotFound
            | Self::StreamNotFound
            | Self::SnapshotNotFound
            | Self::ForkSourceNotFound
            | Self::SubscriptionNotFound => 404,
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
            | Self::MembershipConflict
            | Self::SubscriptionConflict
            | Self::Fenced
            | Self::AlreadyClaimed => 409,
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

impl ErrorToken {
    /// The token as the protocol's reserved `__ds` APIs spell codes: `WEBHOOK_URL_REJECTED`.
    pub fn protocol_code(self) -> String {
        let mut code = String::new();
        for (i, c) in self.as_str().chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                code.push('_');
            }
            code.push(c.to_ascii_uppercase());
        }
        code
    }
}

impl std::fmt::Display for ErrorToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
