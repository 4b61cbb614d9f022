//! User-space extras: lets the shared types be read from and written to aya maps.

use crate::{
    connect::ConnectEvent,
    rule::{CidrKey, EgressKey, EndpointKey, EndpointRule},
    summary::{SummaryKey, SummarySeen, SummaryValue},
    unix::UnixName,
};

// SAFETY: all are #[repr(C)], Copy, contain only integers and byte arrays, and have explicit
// padding fields, so every bit pattern is valid and no byte is uninitialised.
unsafe impl aya::Pod for EndpointKey {}
unsafe impl aya::Pod for CidrKey {}
unsafe impl aya::Pod for EgressKey {}
unsafe impl aya::Pod for EndpointRule {}
unsafe impl aya::Pod for ConnectEvent {}
unsafe impl aya::Pod for SummaryKey {}
unsafe impl aya::Pod for SummaryValue {}
unsafe impl aya::Pod for SummarySeen {}
unsafe impl aya::Pod for UnixName {}
