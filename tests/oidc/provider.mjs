// A real OpenID Connect provider (panva/node-oidc-provider) for the SSO tests, on 127.0.0.1:PORT.
//
//   node provider.mjs PORT REDIRECT_URI[,REDIRECT_URI...] CLIENT_ID CLIENT_SECRET
//
// One confidential client that must use PKCE (S256). People live in memory: the test adds and
// removes them through /__test/ (this process is the IdP's directory, not a stand-in for one).
// Login is a plain username + password form (our own interaction, not the dev one, which signs
// anyone in): an unknown or removed person is refused with access_denied.
// Test levers, each a real provider behaviour: /__test/clock shifts the provider's clock (its tokens
// come out already expired), /__test/tamper flips a byte in the next ID tokens' signatures.
import { createServer } from 'node:http';
import Provider from 'oidc-provider';

const [port, redirectUris, clientId, clientSecret] = process.argv.slice(2);
const redirects = redirectUris.split(',');
const issuer = `http://127.0.0.1:${port}`;
const people = new Map(); // sub -> { password, email, name, groups }
let clockOffsetMs = 0;
let tamper = false;

const realNow = Date.now;
Date.now = () => realNow() + clockOffsetMs; // oidc-provider's epochTime reads Date.now()

const provider = new Provider(issuer, {
  clients: [{
    client_id: clientId, client_secret: clientSecret, redirect_uris: redirects,
    post_logout_redirect_uris: redirects.map((uri) => new URL('/login/', uri).href),
    token_endpoint_auth_method: 'client_secret_post', grant_types: ['authorization_code'], response_types: ['code'],
  }],
  pkce: { required: () => true },
  scopes: ['openid', 'email', 'profile', 'groups'],
  claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name', 'preferred_username'], groups: ['groups'] },
  features: { devInteractions: { enabled: false }, rpInitiatedLogout: { enabled: true } },
  // interaction and session cookies outlive the clock lever (-1 h), so the browser still sends them
  ttl: { IdToken: 300, AccessToken: 300, AuthorizationCode: 60, Session: 14400, Grant: 14400, Interaction: 7200 },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  cookies: { keys: ['veronica-test-cookie-key'] },
  async findAccount(ctx, sub) {
    const person = people.get(sub);
    if (!person) return undefined; // removed at the IdP: no session, no token, no userinfo
    return {
      accountId: sub,
      async claims() {
        return { sub, email: person.email, email_verified: person.email_verified !== false, name: person.name, preferred_username: sub,
          groups: person.groups };
      },
    };
  },
});
provider.proxy = false;

function readBody(req) {
  return new Promise((resolve, reject) => {
    let data = '';
    req.on('data', (chunk) => { data += chunk; });
    req.on('end', () => resolve(data));
    req.on('error', reject);
  });
}

const esc = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

// our interaction: login (checked against `people`), then consent granted at once
provider.use(async (ctx, next) => {
  const m = ctx.path.match(/^\/interaction\/([^/]+)(\/login)?$/);
  if (!m) {
    if (ctx.path.startsWith('/auth')) {
      // a person removed from the directory has no session any more (as a real IdP ends them)
      const session = await provider.Session.get(ctx);
      if (session.accountId && !people.has(session.accountId)) await session.destroy();
    }
    await next();
    if (tamper && ctx.path === '/token' && ctx.body && ctx.body.id_token) {
      const [h, p, s] = ctx.body.id_token.split('.');
      ctx.body = { ...ctx.body, id_token: `${h}.${p}.${(s[0] === 'A' ? 'B' : 'A')}${s.slice(1)}` };
    }
    return;
  }
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  if (ctx.method === 'GET' && !m[2]) {
    if (details.prompt.name === 'consent') {
      const grant = details.grantId ? await provider.Grant.find(details.grantId)
        : new provider.Grant({ accountId: details.session.accountId, clientId: details.params.client_id });
      if (details.prompt.details.missingOIDCScope) grant.addOIDCScope(details.prompt.details.missingOIDCScope.join(' '));
      if (details.prompt.details.missingOIDCClaims) grant.addOIDCClaims(details.prompt.details.missingOIDCClaims);
      await provider.interactionFinished(ctx.req, ctx.res, { consent: { grantId: await grant.save() } },
        { mergeWithLastSubmission: true });
      ctx.respond = false;
      return;
    }
    ctx.type = 'html';
    ctx.body = `<form method="post" action="/interaction/${esc(details.uid)}/login">
      <input name="login"><input name="password" type="password"><button>Sign in</button></form>`;
    return;
  }
  if (ctx.method === 'POST' && m[2]) {
    const form = new URLSearchParams(await readBody(ctx.req));
    const person = people.get(form.get('login'));
    const result = person && person.password === form.get('password')
      ? { login: { accountId: form.get('login') } }
      : { error: 'access_denied', error_description: 'unknown person or wrong password' };
    await provider.interactionFinished(ctx.req, ctx.res, result, { mergeWithLastSubmission: false });
    ctx.respond = false;
    return;
  }
  ctx.status = 405;
});

const oidc = provider.callback();
createServer(async (req, res) => {
  if (req.url.startsWith('/__test/')) {
    const body = req.method === 'POST' ? JSON.parse((await readBody(req)) || '{}') : {};
    if (req.url === '/__test/person') people.set(body.sub, body);
    else if (req.url === '/__test/remove') people.delete(body.sub);
    else if (req.url === '/__test/clock') clockOffsetMs = body.offset_seconds * 1000;
    else if (req.url === '/__test/tamper') tamper = !!body.on;
    res.writeHead(204).end();
    return;
  }
  oidc(req, res);
}).listen(Number(port), '127.0.0.1', () => console.log(`listening ${issuer}`));
