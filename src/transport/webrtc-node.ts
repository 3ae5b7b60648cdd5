// WebRTC for native nodes: @roamhq/wrtc (libwebrtc, prebuilt for each platform as an npm
// package), handed to simple-peer as its `wrtc`, so a browser stage and a native stage open the
// same data channels two tabs do — peer to peer, DTLS-encrypted — instead of two legs through
// the server's relay. Loaded lazily: a platform without the prebuilt binary still serves, over
// the relay, and says why.

export interface NodeWebRtc {
  /** what simple-peer takes as `wrtc` */
  wrtc: unknown;
}

let loading: Promise<NodeWebRtc | { error: string }> | null = null;

/** The WebRTC implementation, or why there is none on this platform. */
export function loadNodeWebRtc(): Promise<NodeWebRtc | { error: string }> {
  loading ??= import('@roamhq/wrtc').then(
    (m) => {
      const wrtc = (m as { default?: unknown }).default ?? m;
      return typeof (wrtc as { RTCPeerConnection?: unknown }).RTCPeerConnection === 'function' ? { wrtc } : { error: '@roamhq/wrtc has no RTCPeerConnection' };
    },
    (e: Error) => ({ error: `@roamhq/wrtc did not load (${e.message.split('\n')[0]})` }),
  );
  return loading;
}
