// Answers a waiting call in the daemon's web view, in headless Chromium (playwright-core):
// waits until the "Waiting for you" list shows the call, prints what the row says as JSON, and
// clicks its approve button (or deny, answering the page's prompt with a reason). Prints
// "answered" once that row is gone, then what the dialog said as JSON. Args: API address, web
// token, approve|deny, screenshot path.
const path = require("path");
const { chromium } = require(path.join(process.env.PEERS_NODE, "node_modules", "playwright-core"));

const [api, token, verdict, screenshot] = process.argv.slice(2);

(async () => {
  const browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  try {
    const page = await browser.newPage();
    let dialog = null;
    page.on("dialog", (d) => { dialog = d.message(); d.accept("not from the web"); });
    await page.goto(`http://${api}/#token=${token}`);
    await page.waitForSelector("#ask-rows tr", { timeout: 60000 });
    const row = await page.$$eval("#ask-rows tr td", (tds) => tds.map((td) => td.textContent));
    console.log(JSON.stringify({ row, visible: await page.isVisible("#asks") }));
    await page.screenshot({ path: screenshot, fullPage: true });
    const id = row[0];
    await page.click(`#ask-rows tr[data-id="${id}"] button.${verdict}`);
    // That row goes (the next call's question may already have taken its place).
    await page.waitForFunction((id) => !document.querySelector(`#ask-rows tr[data-id="${id}"]`), id, { timeout: 10000 });
    console.log("answered");
    console.log(JSON.stringify({ dialog }));
  } finally {
    await browser.close();
  }
})().catch((e) => { console.error(e); process.exit(1); });
