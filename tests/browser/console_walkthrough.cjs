// Walks the console in headless Chromium (Debian's, driven by playwright-core): alice signs in,
// reads the fleet, opens a live session waiting for her, approves its call, and watches the
// turn settle; mallory, a reader of another namespace, sees none of it. Screenshots go to the
// directory given. Driven by tests/cluster/test_console_browser.py; exits non-zero on failure.
"use strict";

const { chromium } = require("playwright-core");

const [url, chromiumPath, aliceToken, malloryToken, namespace, session, shots] = process.argv.slice(2);
const TIMEOUT = 60000;

function check(ok, what) {
  if (!ok) throw new Error(`check failed: ${what}`);
  console.log(`ok: ${what}`);
}

async function signIn(browser, token) {
  const context = await browser.newContext({ viewport: { width: 1360, height: 900 } });
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  await page.goto(`${url}/`);
  check(page.url().endsWith("/login"), "an anonymous visit is sent to sign in");
  await page.fill("textarea[name=token]", token);
  await Promise.all([page.waitForURL(`${url}/`), page.click("form.login button")]);
  return { context, page };
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
    const row = page.locator(`tr.session[data-session="${session}"]`);
    await row.waitFor();
    check((await row.innerText()).includes("WaitingForHuman"), "the fleet shows the waiting session");
    await page.screenshot({ path: `${shots}/fleet.png`, fullPage: true });

    await Promise.all([page.waitForURL(`**/sessions/${session}`), row.locator("a").first().click()]);
    await page.locator('#stream-state[data-state="live"]').waitFor();
    await page.locator('#stream li.tool[data-tool="bash"]').first().waitFor();
    check(true, "the live turn streams the held tool call");
    const approve = page.locator("#approvals form.decide button.approve");
    await approve.waitFor();
    await page.screenshot({ path: `${shots}/session.png`, fullPage: true });

    await page.goto(`${url}/approvals`);
    await page.locator("table.approvals form.decide").first().waitFor();
    await page.screenshot({ path: `${shots}/approvals.png`, fullPage: true });
    await page.goBack();
    await page.locator('#stream-state[data-state="live"]').waitFor();

    await page.locator("#approvals form.decide input[name=reason]").fill("reviewed in the console");
    await page.locator("#approvals form.decide button.approve").click();
    await page.locator("#approvals td.decision", { hasText: "Approved by system:serviceaccount:" }).waitFor();
    check(true, "the approval reads Approved by alice's own identity");
    await page.locator("#stream li.settled.status-completed").waitFor();
    await page.locator("#stream li.tool .result", { hasText: "MERGED" }).first().waitFor();
    check(true, "the replayed call's result and the settlement stream in");
    await page.locator("#phase", { hasText: "Succeeded" }).waitFor();
    check(true, "the phase turns Succeeded without a reload");
    const cost = await page.locator("#cost").innerText();
    check(/^\$\d+\.\d{4}$/.test(cost), `the cost so far is shown (${cost})`);
    await page.screenshot({ path: `${shots}/session-decided.png`, fullPage: true });

    // mallory: reads another namespace, sees nothing of alice's.
    const other = await signIn(browser, malloryToken);
    const fleet = await other.page.content();
    check(!fleet.includes(session) && !fleet.includes(namespace), "mallory's fleet shows nothing of alice's namespace");
    const answer = await other.page.goto(`${url}/ns/${namespace}/sessions/${session}`);
    check(answer.status() === 403, "mallory gets 403 for alice's session");
    check(!(await other.page.content()).includes("git merge"), "and nothing of its content");
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
