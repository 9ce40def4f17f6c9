//! Why a profile read from outside (a recording) is refused: one line for the user, after the
//! file's name ("FILE is damaged: ...").

/// A recording that cannot be read back as a profile.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum RecordingError {
    #[error("is not a tachyon-bpf recording")]
    NotARecording,
    #[error("is a version {0} recording; this tachyon-bpf reads versions 1 to {1}")]
    Version(u32, u32),
    /// The bytes do not decode (gzip or JSON): the decoder's message.
    #[error("is damaged: {0}")]
    Undecodable(String),
    #[error("decompresses to more than {0} MiB, the limit of a recording")]
    TooLarge(u64),
    #[error("is damaged: the {0} table's columns differ in length")]
    Columns(&'static str),
    /// A name no version of the profiler writes: (what, the name).
    #[error("has an unknown {0} {1:?}")]
    Unknown(&'static str, String),
    #[error("is damaged: {0} {1} refers out of range")]
    OutOfRange(&'static str, usize),
    #[error("is damaged: a sample of thread {0} refers out of range")]
    SampleOutOfRange(u32),
    #[error("is damaged: has a stack deeper than {0} frames (a run records at most that)")]
    TooDeep(usize),
    #[error("is damaged: would expand to {0} frames written out, more than the limit of {1}")]
    TooManyFrames(u64, u64),
    #[error("is damaged: the sampling interval is not positive")]
    Interval,
}
