// The web app's entry: the landing page at /, a room at /room/<id>#secret=….
import './styles.css';
import { createLanding } from './landing.ts';
import { createRoomPage } from './room-page.ts';

const app = document.getElementById('app')!;
if (/^\/room\/[^/]+\/?$/.test(location.pathname)) {
  app.replaceChildren(createRoomPage(location.href));
} else {
  app.replaceChildren(createLanding((joinUrl) => location.assign(joinUrl)));
}
