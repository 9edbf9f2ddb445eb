// Walks the console in headless Chromium (Debian's, driven by playwright-core): alice signs in,
// reads the fleet, opens a live session waiting for her, finds Approve and Deny on screen and
// clickable at a laptop's, a wide screen's and a phone's width, approves the call with a
// reason, watches the turn settle, and reads what the agent delivered as a pull request's
// patch; mallory, a reader of another namespace, sees none of it. Screenshots go to the
// directory given. Driven by tests/cluster/test_console_browser.py; exits non-zero on failure.
"use strict";

const { chromium } = require("playwright-core");

const [url, chromiumPath, aliceToken, malloryToken, namespace, session, otherNamespace, shots] =
  process.argv.slice(2);
const TIMEOUT = 60000;
const REASON = "reviewed in the console: main has nothing risky";
const WIDTHS = [
  [1280, 800],
  [1920, 1080],
  [390, 844],
];

function check(ok, what) {
  if (!ok) throw new Error(`check failed: ${what}`);
  console.log(`ok: ${what}`);
}

async function signIn(browser, token) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  await page.goto(`${url}/`);
  check(page.url().endsWith("/login"), "an anonymous visit is sent to sign in");
  await page.fill("textarea[name=token]", token);
  await Promise.all([page.waitForURL(`${url}/`), page.click("form.login button")]);
  return { context, page };
}

// The button is on screen without scrolling sideways: the page is no wider than the window,
// and once scrolled to vertically (never horizontally) the button lies inside the viewport and
// is what a click at its centre lands on.
async function onScreen(page, selector, what) {
  const found = await page.evaluate((sel) => {
    const button = document.querySelector(sel);
    if (!button) return { missing: true };
    const doc = document.documentElement;
    const box0 = button.getBoundingClientRect();
    window.scrollTo(0, window.scrollY + box0.top - window.innerHeight / 2);
    const box = button.getBoundingClientRect();
    const x = box.left + box.width / 2;
    const y = box.top + box.height / 2;
    const hit = document.elementFromPoint(x, y);
    return {
      pageWidth: doc.scrollWidth,
      viewport: [window.innerWidth, window.innerHeight],
      scrollX: window.scrollX,
      box: [box.left, box.top, box.right, box.bottom],
      hit: hit === button || button.contains(hit),
    };
  }, selector);
  const [w, h] = found.viewport || [0, 0];
  const [left, top, right, bottom] = found.box || [0, 0, 0, 0];
  check(!found.missing, `${what}: the button is on the page`);
  check(found.pageWidth <= w && found.scrollX === 0,
    `${what}: the page is no wider than the ${w} px window (${found.pageWidth} px)`);
  check(left >= 0 && right <= w && top >= 0 && bottom <= h,
    `${what}: the button is inside the ${w}x${h} viewport (${found.box.map(Math.round)})`);
  check(found.hit, `${what}: a click at its centre lands on it`);
}

(async () => {
  const browser = await chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    // alice: the fleet, then the live session.
    const { page } = await signIn(browser, aliceToken);
    check(await page.locator("header form[action='/logout'] button").isVisible(),
      "a person signed in with a token may sign out");
    const row = page.locator(`tr.session[data-session="${session}"]`);
    await row.waitFor();
    check((await row.innerText()).includes("WaitingForHuman"), "the fleet shows the waiting session");
    await page.screenshot({ path: `${shots}/fleet.png`, fullPage: true });

    await Promise.all([page.waitForURL(`**/sessions/${session}`), row.locator("a").first().click()]);
    await page.locator('#stream-state[data-state="live"]').waitFor();
    await page.locator('#stream li.tool[data-tool="bash"]').first().waitFor();
    check(true, "the live turn streams the held tool call");
    await page.locator("#approvals form.decide button.approve").waitFor();
    for (const [width, height] of WIDTHS) {
      await page.setViewportSize({ width, height });
      for (const kind of ["approve", "deny"]) {
        await onScreen(page, `#approvals form.decide button.${kind}`, `session page at ${width} px, ${kind}`);
      }
      if (width === 390) await page.screenshot({ path: `${shots}/session-phone.png`, fullPage: true });
    }
    await page.setViewportSize({ width: 1280, height: 800 });
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: `${shots}/session.png`, fullPage: true });

    await page.goto(`${url}/approvals`);
    await page.locator(".approvals form.decide").first().waitFor();
    for (const [width, height] of WIDTHS) {
      await page.setViewportSize({ width, height });
      for (const kind of ["approve", "deny"]) {
        await onScreen(page, `.approvals form.decide button.${kind}`, `approvals page at ${width} px, ${kind}`);
      }
    }
    await page.setViewportSize({ width: 1280, height: 800 });
    await page.screenshot({ path: `${shots}/approvals.png`, fullPage: true });
    await page.goBack();
    await page.locator('#stream-state[data-state="live"]').waitFor();

    await page.locator("#approvals form.decide input[name=reason]").fill(REASON);
    // The page redraws its fragments every 2 s: what a person typed must outlive a redraw.
    await page.waitForTimeout(4500);
    check((await page.locator("#approvals form.decide input[name=reason]").inputValue()) === REASON,
      "the typed reason outlives the page's refresh");
    await page.locator("#approvals form.decide button.approve").click();
    const decided = page.locator("#approvals .decision", { hasText: "Approved by system:serviceaccount:" });
    await decided.waitFor();
    check(true, "the approval reads Approved by alice's own identity");
    check((await decided.locator("q.comment").innerText()) === REASON, "and shows the reason she gave");
    await page.locator("#stream li.settled.status-completed").waitFor();
    await page.locator("#stream li.tool .result", { hasText: "MERGED" }).first().waitFor();
    check(true, "the replayed call's result and the settlement stream in");
    await page.locator("#phase", { hasText: "Succeeded" }).waitFor();
    check(true, "the phase turns Succeeded without a reload");
    await page.waitForFunction(() => {
      const state = document.getElementById("stream-state");
      return state.dataset.state !== "live" && state.textContent !== "live";
    }, null, { timeout: 10000 });
    check(true, `and the turn no longer says live (${await page.locator("#stream-state").innerText()})`);
    const cost = await page.locator("#cost").innerText();
    check(/^\$\d+\.\d{4}$/.test(cost), `the cost so far is shown (${cost})`);

    // What the agent delivered, read from the remote through the console, turn by turn.
    const turn = page.locator("#changes details.turn");
    await turn.first().waitFor();
    const revision = await turn.first().getAttribute("data-revision");
    check(/^[0-9a-f]{40}$/.test(revision || ""), `the turn names its delivered revision (${revision})`);
    check((await page.locator("#delivered").innerText()).includes(revision.slice(0, 12)),
      "the status shows the same revision delivered");
    const file = page.locator('#changes .file[data-path="CHANGES.md"]');
    await file.waitFor();
    check((await file.locator("tr.d-add").allInnerTexts()).some((t) => t.includes("+merged main, as approved")),
      "the patch shows the agent's added line, coloured as added");
    check(await page.locator("#changes .fstat-A").count() >= 1, "the file is marked added");
    await page.screenshot({ path: `${shots}/session-decided.png`, fullPage: true });
    await page.locator("#changes").screenshot({ path: `${shots}/changes.png` });

    // The finished session, opened afresh: its turn is a record, never "live"; its conditions
    // are listed with their heading.
    await page.reload();
    for (let i = 0; i < 6; i++) {
      const state = page.locator("#stream-state");
      check((await state.getAttribute("data-state")) !== "live" && !/^live$/.test(await state.innerText()),
        `a finished session does not say live (${await state.innerText()})`);
      await page.waitForTimeout(500);
    }
    check(await page.locator("#conditions h2", { hasText: "Conditions" }).count() === 1 &&
      await page.locator("#conditions tr.condition").count() > 0, "the conditions are listed under their heading");

    // An unknown session of her own namespace is not found; the fleet is unchanged.
    const missing = await page.goto(`${url}/ns/${namespace}/sessions/no-such-session`);
    check(missing.status() === 404, "an unknown session is 404");

    // mallory: reads another namespace, sees nothing of alice's.
    const other = await signIn(browser, malloryToken);
    const fleet = await other.page.content();
    check(!fleet.includes(session) && !fleet.includes(namespace), "mallory's fleet shows nothing of alice's namespace");
    const answer = await other.page.goto(`${url}/ns/${namespace}/sessions/${session}`);
    check(answer.status() === 403, "mallory gets 403 for alice's session");
    check(!(await other.page.content()).includes("git merge"), "and nothing of its content");
    const guess = await other.page.goto(`${url}/ns/${namespace}/sessions/no-such-session`);
    check(guess.status() === 403, "and 403, not 404, for a name she guesses there");
    const own = await other.page.goto(`${url}/ns/${otherNamespace}/sessions/no-such-session`);
    check(own.status() === 404, "in her own namespace an unknown session is 404");
    const approvals = await other.page.goto(`${url}/approvals`);
    check(approvals.status() === 200 && !(await other.page.content()).includes(session), "mallory's approvals list is empty of it");
    console.log("walkthrough passed");
  } finally {
    await browser.close();
  }
})().catch((err) => {
  console.error(err.stack || String(err));
  process.exit(1);
});
