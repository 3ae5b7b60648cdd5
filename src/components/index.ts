// The web-component bundle: `<script type="module" src="http://host:8080/components/gguf-mesh.js">`
// defines <gguf-mesh-peer> and <gguf-mesh-chat>. Built by `vite build --mode components`.

import { GgufMeshChatElement } from './chat-element.ts';
import { GgufMeshPeerElement } from './peer-element.ts';

export { GgufMeshChatElement, GgufMeshPeerElement };

if (!customElements.get('gguf-mesh-peer')) customElements.define('gguf-mesh-peer', GgufMeshPeerElement);
if (!customElements.get('gguf-mesh-chat')) customElements.define('gguf-mesh-chat', GgufMeshChatElement);

declare global {
  interface HTMLElementTagNameMap {
    'gguf-mesh-peer': GgufMeshPeerElement;
    'gguf-mesh-chat': GgufMeshChatElement;
  }
}
