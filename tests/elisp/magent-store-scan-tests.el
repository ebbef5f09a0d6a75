;;; magent-store-scan-tests.el --- ERT tests for M-x magent-store-scan  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Sessions with planted secrets (tests/leaky.py, built by the checkout's
;; Python) are scanned by the real `magent-store scan' process, as a
;; user's Emacs runs it: the list names each secret's session, field,
;; kind and fingerprint, never the secret; the user's own patterns are
;; looked for when `magent-store-redact-patterns' is set; RET shows the
;; session.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'json)
(require 'magent-store-test)
(require 'magent-store-scan)

(defvar magent-store-redact-patterns)

(defconst magent-store-scan-test--tests
  (expand-file-name ".." (file-name-directory (or load-file-name buffer-file-name)))
  "The checkout's tests/ folder, where leaky.py builds sessions with secrets.")

(defun magent-store-scan-test--planted (root)
  "Make a session with planted secrets and a clean one under ROOT; return the secrets."
  (let* ((program (car (magent-store-program)))
         (python (expand-file-name "python" (file-name-directory program)))
         (script (format "import json, sys
sys.path[:0] = [%S]
from pathlib import Path
import leaky
leaky.seven(Path(%S))
leaky.clean(Path(%S))
print(json.dumps(list(leaky.PLANTED)))"
                         magent-store-scan-test--tests root root)))
    (with-temp-buffer
      (should (equal (call-process python nil t nil "-c" script) 0))
      (json-parse-string (buffer-string) :array-type 'list))))

(defun magent-store-scan-test--wait (buffer)
  "Wait until the scan of BUFFER has drawn its findings."
  (with-timeout (60 (error "The scan did not finish"))
    (while (buffer-local-value 'magent-store-scan--process buffer)
      (accept-process-output nil 0.05))))

(defun magent-store-scan-test--kinds (buffer)
  "Return the kinds of secret listed in BUFFER, sorted, each once."
  (with-current-buffer buffer
    (sort (delete-dups (mapcar (lambda (entry) (aref (cadr entry) 2)) tabulated-list-entries))
          #'string<)))

(ert-deftest magent-store-scan-lists-secrets-without-showing-them ()
  "A scan returns at once, then lists each secret by session, field, kind and fingerprint."
  (magent-store-test--with-backend
    (let* ((secrets (magent-store-scan-test--planted magent-store-root))
           (buffer (let ((magent-store-redact-patterns '(("ticket" . "TICKET-[0-9]{6}"))))
                     (magent-store-scan))))
      ;; Asynchronous: the scan runs in its own process.
      (should (process-live-p (buffer-local-value 'magent-store-scan--process buffer)))
      (magent-store-scan-test--wait buffer)
      (should (equal (magent-store-scan-test--kinds buffer)
                     '("aws-access-token" "github-pat" "gitlab-pat" "huggingface-access-token"
                       "jwt" "openai-api-key" "private-key" "slack-bot-token" "ticket")))
      (with-current-buffer buffer
        (let ((rows (length tabulated-list-entries))
              (text (buffer-string)))
          (should (string-match-p
                   (format "\\`%d secrets in 1 session: `magent-store scrub .*' removes them"
                           rows)
                   (string-trim (apply #'concat header-line-format))))
          ;; Only the session holding secrets, named by its title, itself redacted.
          (should (string-match-p "Your key: \\[redacted:aws-access-token\\]" text))
          (should (string-match-p "turn 1 (t1)/item 2 (c1)/input/command" text))
          (should (string-match-p "\\b[0-9a-f]\\{8\\}\\b" text))
          (dolist (secret secrets)
            (should-not (string-search secret text))))
        (should buffer-read-only)))))

(ert-deftest magent-store-scan-without-user-patterns-and-ret-shows-the-session ()
  "Without `magent-store-redact-patterns' only credentials are listed; RET shows the session."
  (magent-store-test--with-backend
    (magent-store-scan-test--planted magent-store-root)
    (let ((buffer (magent-store-scan)))
      (magent-store-scan-test--wait buffer)
      (should-not (member "ticket" (magent-store-scan-test--kinds buffer)))
      (with-current-buffer buffer
        (goto-char (point-min))
        (while (and (not (tabulated-list-get-id)) (not (eobp)))
          (forward-line 1))
        (let ((view (magent-store-scan-open)))
          (with-timeout (60 (error "The session was not shown"))
            (while (with-current-buffer view
                     (string-prefix-p "Reading" (buffer-string)))
              (accept-process-output nil 0.05)))
          (with-current-buffer view
            (should (string-match-p "── assistant ──\nYour key: " (buffer-string)))
            ;; Where the session lives, and its id, under its title.
            (should (string-match-p "^global  leaky$" (buffer-string)))))))))

(ert-deftest magent-store-scan-says-when-nothing-is-found-or-the-root-is-missing ()
  "A clean tree: no row and a header line that says so; no root: a user error."
  (magent-store-test--with-backend
    (let* ((program (car (magent-store-program)))
           (python (expand-file-name "python" (file-name-directory program))))
      (should (equal (call-process python nil nil nil "-c"
                                   (format "import sys\nsys.path[:0] = [%S]\nfrom pathlib import Path\nimport leaky\nleaky.clean(Path(%S))"
                                           magent-store-scan-test--tests magent-store-root))
                     0)))
    (let ((buffer (magent-store-scan)))
      (magent-store-scan-test--wait buffer)
      (with-current-buffer buffer
        (should-not tabulated-list-entries)
        (should (equal (string-trim (apply #'concat header-line-format)) "No secret found"))))
    (should-error (magent-store-scan (expand-file-name "nowhere" magent-store-root)) :type 'user-error)))

(defun magent-store-scan-test--messages (function)
  "Call FUNCTION; return the messages it showed, latest first."
  (let* ((said nil)
         (record (lambda (format &rest args)
                   (when format (push (apply #'format-message format args) said)))))
    (advice-add 'message :before record)
    (unwind-protect (funcall function)
      (advice-remove 'message record))
    said))

(defun magent-store-scan-test--again (again)
  "Scan, then call AGAIN with the list's buffer while that scan is held still.
The first scan must be stopped without a word of failure, and the second
one's findings drawn."
  (magent-store-test--with-backend
    (magent-store-scan-test--planted magent-store-root)
    (let* ((buffer (magent-store-scan))
           (first (buffer-local-value 'magent-store-scan--process buffer)))
      (unwind-protect
          (progn
            ;; Held still, the first scan is running when the second starts.
            (signal-process first 'SIGSTOP)
            (let ((said (magent-store-scan-test--messages (lambda () (funcall again buffer)))))
              (should-not (cl-find-if (lambda (m) (string-match-p "fail" m)) said)))
            (should-not (process-live-p first))
            (let ((second (buffer-local-value 'magent-store-scan--process buffer)))
              (should (process-live-p second))
              (should-not (eq first second)))
            (magent-store-scan-test--wait buffer)
            (should (member "github-pat" (magent-store-scan-test--kinds buffer))))
        (when (process-live-p first)
          (signal-process first 'SIGCONT)
          (delete-process first))))))

(ert-deftest magent-store-scan-again-stops-the-scan-still-running ()
  "Scanning again (\\[revert-buffer]) while a scan runs stops that scan: one
scan at a time draws the list."
  (magent-store-scan-test--again
   (lambda (buffer) (with-current-buffer buffer (revert-buffer)))))

(ert-deftest magent-store-scan-run-again-as-a-command-stops-the-scan-still-running ()
  "Running `magent-store-scan' again while its scan runs stops that scan,
as scanning again in the list does: no scan is left running unseen."
  (magent-store-scan-test--again
   (lambda (buffer) (should (eq (magent-store-scan) buffer)))))

(ert-deftest magent-store-scan-names-the-sessions-it-could-not-read ()
  "A session that cannot be read is counted in the header line, in words."
  (magent-store-test--with-backend
    (magent-store-scan-test--planted magent-store-root)
    (with-temp-file (expand-file-name "global/broken.json" magent-store-root)
      (insert "{\"schema-version\": 7, \"id\": "))
    (let ((buffer (magent-store-scan)))
      (magent-store-scan-test--wait buffer)
      (should (string-match-p
               "secrets in 1 session: `magent-store scrub .*' removes them (keeping a backup); 1 session could not be read\\'"
               (string-trim (apply #'concat (buffer-local-value 'header-line-format buffer))))))))

(ert-deftest magent-store-scan-a-failed-scan-says-why-once ()
  "A scan that fails says why, without the program's prefix, in the header
line and once in the echo area; one that succeeds says nothing there."
  (magent-store-test--with-backend
    (magent-store-scan-test--planted magent-store-root)
    (let* ((messages nil)
           (buffer nil))
      (cl-letf (((symbol-function 'message)
                 (lambda (format &rest args)
                   (when format (push (apply #'format-message format args) messages)))))
        (let ((magent-store-redact-patterns '(("bad" . "("))))
          (setq buffer (magent-store-scan))
          (magent-store-scan-test--wait buffer))
        (let ((why "the pattern of kind 'bad': not a regular expression: "))
          (should (string-prefix-p why (string-trim (apply #'concat (buffer-local-value
                                                                     'header-line-format buffer)))))
          (should (equal (length (cl-remove-if-not
                                  (lambda (m) (string-prefix-p (concat "magent-store-scan: " why) m))
                                  messages))
                         1)))
        (setq messages nil)
        (magent-store-scan-test--wait (magent-store-scan))
        (should-not (cl-remove-if-not (lambda (m) (string-prefix-p "magent-store-scan: " m))
                                      messages))))))

(ert-deftest magent-store-scan-as-a-command-shows-its-list ()
  "Run as a command the scan's list is shown; from Lisp it is only returned."
  (magent-store-test--with-backend
    (magent-store-scan-test--planted magent-store-root)
    (save-window-excursion
      (let ((buffer (magent-store-scan)))
        (should-not (get-buffer-window buffer))
        (magent-store-scan-test--wait buffer)
        (kill-buffer buffer)))
    (save-window-excursion
      (let ((buffer (call-interactively #'magent-store-scan)))
        (should (eq (window-buffer (selected-window)) buffer))
        (magent-store-scan-test--wait buffer)
        (kill-buffer buffer)))))

(ert-deftest magent-store-scan-finds-what-this-emacs-has-not-saved-yet ()
  "What the backend was sent but not told to write is written before the scan reads."
  (magent-store-test--with-backend
    (let ((magent-store-flush-interval 3600))  ; no timer writes it meanwhile
      (magent-store-open "s1")
      (magent-store-test--start-turn "s1")
      (magent-store-append-item-content
       "s1" "item-1" (concat "the key gh" "p_" "ZGqKTOXsMF886xp2AV4g2wn4nykeEdoZdVvF, use it"))
      (let ((buffer (magent-store-scan)))
        (magent-store-scan-test--wait buffer)
        (should (equal (magent-store-scan-test--kinds buffer) '("github-pat")))))))

(ert-deftest magent-store-scrub-closes-this-emacs-sessions-then-scrubs-them ()
  "A session this Emacs's backend holds is closed first, then scrubbed; one line says so."
  (magent-store-test--with-backend
    (let ((secrets (magent-store-scan-test--planted magent-store-root))
          (messages nil))
      (magent-store-open "leaky")  ; its backend holds it now
      (let ((process (cl-letf (((symbol-function 'yes-or-no-p) (lambda (_prompt) t)))
                       (magent-store-scrub))))
        (should-not (gethash "leaky" magent-store--sessions))
        (cl-letf (((symbol-function 'message)
                   (lambda (format &rest args) (push (apply #'format-message format args) messages))))
          (with-timeout (60 (error "The scrub did not finish"))
            (while (or (process-live-p process) magent-store-scrub--process)
              (accept-process-output nil 0.05)))))
      (should (equal (car messages)
                     "magent-store: 2 sessions seen, 1 scrubbed and verified, 1 without secrets"))
      (let ((saved (with-temp-buffer
                     (insert-file-contents (expand-file-name "global/leaky.snapshot" magent-store-root))
                     (buffer-string))))
        (dolist (secret (list (nth 0 secrets) (nth 1 secrets)))  ; gitleaks' aws and github kinds
          (should-not (string-search secret saved)))
        (should (string-search "[redacted:github-pat]" saved)))
      ;; Streaming opens it again.
      (should (magent-store-open "leaky")))))

(defun magent-store-scan-test--scrub-wait (process)
  "Wait until the scrub PROCESS has exited and said how."
  (with-timeout (60 (error "The scrub did not finish"))
    (while (or (process-live-p process) magent-store-scrub--process)
      (accept-process-output nil 0.05))))

(ert-deftest magent-store-scrub-one-at-a-time ()
  "While a scrub runs, another is refused before anything is asked."
  (magent-store-test--with-backend
    (magent-store-scan-test--planted magent-store-root)
    (let ((process (cl-letf (((symbol-function 'yes-or-no-p) (lambda (_prompt) t)))
                     (magent-store-scrub))))
      (unwind-protect
          (progn
            ;; Held still: it is running when the second is asked for.
            (signal-process process 'SIGSTOP)
            (cl-letf (((symbol-function 'yes-or-no-p)
                       (lambda (_prompt) (error "Asked while a scrub runs"))))
              (should (equal (cadr (should-error (magent-store-scrub) :type 'user-error))
                             "A scrub is still running"))))
        (signal-process process 'SIGCONT))
      (magent-store-scan-test--scrub-wait process))))

(ert-deftest magent-store-scrub-that-fails-says-why-and-shows-its-report ()
  "A scrub that fails says why in one line, without the program's prefix,
and shows its report; one that succeeds shows none."
  (magent-store-test--with-backend
    (magent-store-scan-test--planted magent-store-root)
    (save-window-excursion
      (let ((messages nil))
        (cl-letf (((symbol-function 'yes-or-no-p) (lambda (_prompt) t))
                  ((symbol-function 'message)
                   (lambda (format &rest args)
                     (when format (push (apply #'format-message format args) messages)))))
          (let ((magent-store-redact-patterns '(("bad" . "("))))
            (magent-store-scan-test--scrub-wait (magent-store-scrub)))
          (should (string-prefix-p
                   "magent-store: the pattern of kind 'bad': not a regular expression: "
                   (car messages)))
          (should (get-buffer-window magent-store-scrub-buffer))
          (delete-other-windows)
          (switch-to-buffer "*scratch*")
          (magent-store-scan-test--scrub-wait (magent-store-scrub))
          (should (string-match-p "sessions seen" (car messages)))
          (should-not (get-buffer-window magent-store-scrub-buffer)))))))

(ert-deftest magent-store-scan-is-a-command-once-the-core-is-loaded ()
  "(require \='magent-store) is enough for M-x magent-store-scan."
  (with-temp-buffer
    (should (equal (call-process
                    (expand-file-name invocation-name invocation-directory) nil t nil
                    "--batch" "-Q" "-L" (file-name-directory (locate-library "magent-store"))
                    "--eval" "(progn (require 'magent-store) (princ (commandp 'magent-store-scan)))")
                   0))
    (should (equal (string-trim (buffer-string)) "t"))))

(provide 'magent-store-scan-tests)
;;; magent-store-scan-tests.el ends here
