// Reads one HTTP request as JSON on stdin ({"headers": {...}, "body": "..."}), decodes it with the CloudEvents
// JavaScript SDK's HTTP.toEvent, and writes the event's attributes and data as JSON on stdout. Used by
// e2e/cloudevents_test.go; a decoding error exits 1 with the SDK's message on stderr.
const { HTTP } = require("cloudevents");

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  try {
    const req = JSON.parse(input);
    const event = HTTP.toEvent({ headers: req.headers, body: req.body });
    process.stdout.write(JSON.stringify(event.toJSON()));
  } catch (err) {
    process.stderr.write(String(err && err.stack ? err.stack : err) + "\n");
    process.exit(1);
  }
});
