// Drives the daemon's web view in headless Chromium: loads the page, waits until it is live,
// says so (the test then records calls), waits for their rows to appear, opens one, and prints what it
// saw as JSON on stdout (the Rust test asserts on it). Args: API address, screenshot path, the
// loopback API's token (the page reads it from the URL's fragment, as `toolwall run` prints it).
const path = require("path");
const { chromium } = require(path.join(process.env.PEERS_NODE, "node_modules", "playwright-core"));

const [api, screenshot, token] = process.argv.slice(2);
const base = `http://${api}`;

(async () => {
  const browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  try {
    const page = await browser.newPage();
    await page.goto(base + "/#token=" + token);
    await page.waitForFunction(() => document.getElementById("status").textContent === "live", null, { timeout: 10000 });
    // The test records the calls (through the daemon's Unix socket: the loopback HTTP API is
    // read-only) once it reads this line.
    console.log("live");
    await page.waitForFunction(() => document.querySelectorAll("#rows tr").length >= 2, null, { timeout: 10000 });
    const rows = await page.$$eval("#rows tr", trs => trs.map(tr => [...tr.children].map(td => td.textContent)));
    await page.click("#rows tr");
    await page.waitForFunction(() => document.getElementById("detail").textContent.includes("LLM layer"), null, { timeout: 10000 });
    await page.waitForFunction(() => !document.getElementById("detail").textContent.includes("loading"), null, { timeout: 10000 });
    const detail = await page.textContent("#detail");
    await page.screenshot({ path: screenshot, fullPage: true });
    console.log(JSON.stringify({ rows, detail }));
  } finally {
    await browser.close();
  }
})().catch(e => { console.error(e); process.exit(1); });
