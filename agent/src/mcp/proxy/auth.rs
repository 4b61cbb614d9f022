//! Authorization passed through: the upstream's challenge reaches the client.

use super::*;

/// The client's answer when the upstream refused its credentials (401, or 403): the status
/// and challenge as the upstream gave them.
pub(super) fn refused_credentials(
    _shared: &Shared,
    _client: &HeaderMap,
    response: Response<Incoming>,
) -> Response<ProxyBody> {
    let mut answer = full(response.status(), None, Bytes::new());
    for value in response.headers().get_all(http::header::WWW_AUTHENTICATE) {
        answer
            .headers_mut()
            .append(http::header::WWW_AUTHENTICATE, value.clone());
    }
    answer
}
