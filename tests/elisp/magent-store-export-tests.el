;;; magent-store-export-tests.el --- ERT tests for M-x magent-store-export-session  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Sessions are written through the shim to a real backend; the command
;; runs the real `magent-store export --format' process, and Org's own
;; parser reads the buffer it opens.

;;; Code:

(require 'ert)
(require 'org)
(require 'org-element)
(require 'magent-store-test)
(require 'magent-store-export)
(require 'magent-store-search-tests)

(defconst magent-store-export-test--reply
  (concat "It splits on *spaces* first:\n"
          "* not a heading\n"
          "#+begin_src is text\n"
          "漢字 and trailing spaces   \n"
          "\n"
          "last line")
  "A reply with lines Org would read as structure.")

(defconst magent-store-export-test--prompt "why does parse_query drop \"quotes\"?"
  "The user's message.")

(defun magent-store-export-test--write (session-id title)
  "Write SESSION-ID titled TITLE: a user message and a streamed reply."
  (magent-store-open session-id)
  (magent-store-append-event session-id (magent-store-test--event "thread-started"))
  (magent-store-append-event
   session-id (magent-store-test--event
               "turn-started" :turn-id "turn-1"
               :payload `((turn . ,(magent-store-test--turn "turn-1")))))
  (dolist (item '(("user-1" . "user") ("item-1" . "assistant")))
    (magent-store-append-event
     session-id (magent-store-test--event
                 "item-started" :turn-id "turn-1" :item-id (car item)
                 :payload `((item . ,(magent-store-test--item (car item) "turn-1" (cdr item)))))))
  (magent-store-append-item-content session-id "user-1" magent-store-export-test--prompt)
  (let ((reply magent-store-export-test--reply))
    (while (> (length reply) 0)
      (let ((n (min 7 (length reply))))
        (magent-store-append-item-content session-id "item-1" (substring reply 0 n))
        (setq reply (substring reply n)))))
  (magent-store-put-header session-id `((title . ,title)))
  (magent-store-flush session-id)
  (expand-file-name (concat "global/" session-id ".json") magent-store-root))

(defun magent-store-export-test--wait (process)
  "Wait until the export PROCESS is done; return the buffer it opened, or nil."
  (with-timeout (60 (error "The export did not finish"))
    (while (or (process-live-p process)
               (not (or (process-get process 'magent-store-export-buffer)
                        (process-get process 'magent-store-export-error))))
      (accept-process-output nil 0.05)))
  (process-get process 'magent-store-export-buffer))

(defun magent-store-export-test--messages ()
  "Return each message heading's title and text, as Org reads the buffer."
  (org-element-map (org-element-parse-buffer) 'headline
    (lambda (headline)
      (when (member (org-element-property :raw-value headline) '("User" "Assistant"))
        (let* ((section (car (org-element-contents headline)))
               (blocks (org-element-map section 'example-block #'identity)))
          (cons (org-element-property :raw-value headline)
                ;; Each message is followed by one newline, which a reader drops.
                (substring (if blocks
                               (org-element-property :value (car blocks))
                             (buffer-substring-no-properties
                              (org-element-property :contents-begin section)
                              (org-element-property :end section)))
                           0 -1)))))))

(ert-deftest magent-store-export-opens-an-org-buffer-with-every-message-exact ()
  "The session opens in an Org buffer named after it, visiting no file, and
Org's parser gives back each message's text exactly."
  (magent-store-test--with-backend
    (let* ((header (magent-store-export-test--write "s-doc" "Fix the parser"))
           (process (magent-store-export-session `((id . "s-doc") (header . ,header))))
           (buffer (magent-store-export-test--wait process)))
      (should (bufferp buffer))
      (unwind-protect
          (with-current-buffer buffer
            (should (derived-mode-p 'org-mode))
            (should (equal (buffer-name) "Fix the parser.org"))
            (should-not buffer-file-name)
            (should (equal (org-entry-get (point-min) "ID") "s-doc"))
            (should (equal (magent-store-export-test--messages)
                           `(("User" . ,magent-store-export-test--prompt)
                             ("Assistant" . ,magent-store-export-test--reply)))))
        (kill-buffer buffer)))))

(ert-deftest magent-store-export-from-the-search-list-and-as-markdown ()
  "In the search results the session on the line is exported; a prefix
argument asks for Markdown."
  (magent-store-test--with-backend
    (magent-store-export-test--write "s-found" "Found by search")
    (magent-store-export-test--write "s-other" "Another one")
    (let ((results (magent-store-search "parse_query")))
      (magent-store-search-test--wait results)
      (with-current-buffer results
        (goto-char (point-min))
        (while (not (equal (alist-get 'id (tabulated-list-get-id)) "s-found"))
          (forward-line 1))
        (let* ((buffer (magent-store-export-test--wait
                        (call-interactively #'magent-store-export-session))))
          (unwind-protect
              (with-current-buffer buffer
                (should (derived-mode-p 'org-mode))
                (should (equal (buffer-name) "Found by search.org"))
                (should (equal (org-entry-get (point-min) "ID") "s-found")))
            (kill-buffer buffer)))
        (let* ((current-prefix-arg '(4))
               (buffer (magent-store-export-test--wait
                        (call-interactively #'magent-store-export-session))))
          (unwind-protect
              (with-current-buffer buffer
                (should (equal (buffer-name) "Found by search.md"))
                (should (derived-mode-p (if (fboundp 'markdown-mode) 'markdown-mode 'text-mode)))
                (should (string-prefix-p "# Found by search\n" (buffer-string)))
                (should (search-forward magent-store-export-test--prompt nil t)))
            (kill-buffer buffer)))))))

(ert-deftest magent-store-export-elsewhere-reads-the-session-from-the-minibuffer ()
  "Outside the search list and magent, the session is read with the finder."
  (magent-store-test--with-backend
    (magent-store-export-test--write "s-read" "Read me")
    (with-temp-buffer
      (let* ((completing-read-function (lambda (_prompt table &rest _)
                                         (car (all-completions "Read" table))))
             (buffer (magent-store-export-test--wait
                      (call-interactively #'magent-store-export-session))))
        (unwind-protect
            (should (equal (with-current-buffer buffer (org-entry-get (point-min) "ID"))
                           "s-read"))
          (kill-buffer buffer))))))

(ert-deftest magent-store-export-in-magents-buffer-takes-the-session-it-shows ()
  "In magent's buffer the export takes the session the buffer shows, by its id.
Saved, it is exported; not saved yet, or an id that names a path rather
than a session, it is a `user-error' that names it, and nothing is read."
  (magent-store-test--with-backend
    (magent-store-export-test--write "s-here" "Shown in magent")
    (let ((shown "s-here"))
      ;; What magent's buffer shows is the one thing taken from magent here.
      (cl-letf (((symbol-function 'magent-store-magent-session-id)
                 (lambda (&optional _buffer) shown)))
        (with-temp-buffer
          (let ((buffer (magent-store-export-test--wait
                         (call-interactively #'magent-store-export-session))))
            (unwind-protect
                (should (equal (with-current-buffer buffer (org-entry-get (point-min) "ID"))
                               "s-here"))
              (kill-buffer buffer)))
          (dolist (id '("s-unsaved" "../global/s-here"))
            (setq shown id)
            (should (equal (should-error (call-interactively #'magent-store-export-session)
                                         :type 'user-error)
                           `(user-error ,(format "Session %s has not been saved yet" id))))))))))

(ert-deftest magent-store-export-a-blank-title-names-the-buffer-by-id ()
  "A session whose title is only blanks gives its buffer the session's id."
  (magent-store-test--with-backend
    (let* ((header (magent-store-export-test--write "s-blank" "   "))
           (buffer (magent-store-export-test--wait
                    (magent-store-export-session
                     `((id . "s-blank") (header . ,header) (title . "   "))))))
      (unwind-protect
          (should (equal (buffer-name buffer) "s-blank.org"))
        (kill-buffer buffer)))))

(ert-deftest magent-store-export-errors-say-why-and-open-nothing ()
  "A session with no file is a `user-error'; a file the export cannot read
gives the export's own message, and no buffer."
  (magent-store-test--with-backend
    (magent-store-export-test--write "s-any" "Any")
    (let ((missing (expand-file-name "global/gone.json" magent-store-root)))
      (should-error (magent-store-export-session `((id . "gone") (header . ,missing)))
                    :type 'user-error))
    (let ((broken (expand-file-name "global/broken.json" magent-store-root))
          (buffers (buffer-list)))
      (with-temp-file broken (insert "{\"schema-version\": 7, \"id\": "))
      (let* ((process (magent-store-export-session `((id . "broken") (header . ,broken))))
             (opened (magent-store-export-test--wait process))
             (why (process-get process 'magent-store-export-error)))
        (should-not opened)
        (should (string-match-p "broken\\.json" why))
        (should-not (string-match-p "Traceback" why))
        (should (equal (cl-remove-if-not #'buffer-live-p (buffer-list))
                       (cl-remove-if-not #'buffer-live-p buffers)))))))

(defun magent-store-export-test--can-redact ()
  "Skip the test unless the export command and Emacs both know redaction."
  (let ((help (with-temp-buffer
                (apply #'call-process (car (magent-store-program)) nil t nil
                       (append (cdr (magent-store-program)) '("export" "--help")))
                (buffer-string))))
    (unless (string-match-p "--redact-spec" help)
      (ert-skip "this magent-store export has no --redact / --redact-spec yet"))
    (unless (require 'magent-store-redact nil t)
      (ert-skip "magent-store-redact.el (the redaction settings) is not there yet"))))

(ert-deftest magent-store-export-redacts-when-redaction-is-on ()
  "With `magent-store-redact' on, the document holds no secret the session does."
  (magent-store-test--with-backend
    (magent-store-export-test--can-redact)
    ;; A key put together at run time: this file holds no secret itself.
    (let* ((secret (concat "AKIA" "Z7QW3ERTY5UIOPLK"))
           (header (progn (magent-store-open "s-secret")
                          (magent-store-test--start-turn "s-secret")
                          (magent-store-append-item-content
                           "s-secret" "item-1"
                           (concat "the key is " secret " here, for TICKET-123456"))
                          (magent-store-flush "s-secret")
                          (expand-file-name "global/s-secret.json" magent-store-root))))
      (dolist (on '(nil t))
        ;; Your own pattern reaches the export through the spec on its input.
        (cl-progv '(magent-store-redact magent-store-redact-patterns)
            (list on '(("ticket" . "TICKET-\\d{6}")))
          (let ((buffer (magent-store-export-test--wait
                         (magent-store-export-session `((id . "s-secret") (header . ,header))))))
            (unwind-protect
                (with-current-buffer buffer
                  (if on
                      (progn (should-not (search-forward secret nil t))
                             (should (search-forward "[redacted:aws-access-token]" nil t))
                             (should (search-forward "[redacted:ticket]" nil t)))
                    (should (search-forward secret nil t))
                    (should (search-forward "TICKET-123456" nil t))))
              (kill-buffer buffer))))))))

(provide 'magent-store-export-tests)
;;; magent-store-export-tests.el ends here
